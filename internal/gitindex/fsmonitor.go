package gitindex

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The fsmonitor extension (FSMN, version 2: fsmonitor.c): a token, then an
// EWAH bitmap (ewah/ewah_io.c) whose set bits are the entries Git must
// check, the others being valid since the token. The launcher writes it
// (the vouch) and rewrites its bitmap (the untracked cache's splice), so
// both go through these two functions.

// fsmonitorVersion2 is the version whose token is a string (version 1
// carries a 64-bit time).
const fsmonitorVersion2 = 2

// FSMonitor is an fsmonitor extension's content.
type FSMonitor struct {
	Token string
	// Dirty has one bit per index entry: set for an entry not valid.
	Dirty []bool
}

// AppendFSMonitor appends an fsmonitor extension (its header and payload)
// for token and dirty to out.
func AppendFSMonitor(out []byte, token string, dirty []bool) []byte {
	bitmap := ewah(dirty)
	payload := make([]byte, 0, 4+len(token)+1+4+len(bitmap))
	payload = binary.BigEndian.AppendUint32(payload, fsmonitorVersion2)
	payload = append(payload, token...)
	payload = append(payload, 0)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(bitmap)))
	payload = append(payload, bitmap...)
	out = append(out, "FSMN"...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(payload)))
	return append(out, payload...)
}

// ReadFSMonitor reads the fsmonitor extension of ix (data being its
// bytes), whose bitmap must have one bit per entry: a version 2 extension
// with its token, any valid EWAH encoding. None is an error.
func ReadFSMonitor(data []byte, ix *Index) (*FSMonitor, error) {
	var p []byte
	for _, x := range ix.Extensions {
		if x.Sig == "FSMN" {
			if p != nil {
				return nil, errors.New("two fsmonitor extensions")
			}
			p = data[x.Off+8 : x.Off+8+x.Size]
		}
	}
	if p == nil {
		return nil, errors.New("no fsmonitor extension")
	}
	if len(p) < 4 || binary.BigEndian.Uint32(p) != fsmonitorVersion2 {
		return nil, errors.New("not a version 2 fsmonitor extension")
	}
	p = p[4:]
	end := -1
	for i, c := range p {
		if c == 0 {
			end = i
			break
		}
	}
	if end < 0 {
		return nil, errors.New("the fsmonitor token is not terminated")
	}
	fm := &FSMonitor{Token: string(p[:end])}
	p = p[end+1:]
	if len(p) < 4 || uint64(binary.BigEndian.Uint32(p)) != uint64(len(p)-4) {
		return nil, errors.New("the fsmonitor bitmap's length is not the extension's rest")
	}
	dirty, err := unewah(p[4:])
	if err != nil {
		return nil, fmt.Errorf("the fsmonitor bitmap: %w", err)
	}
	if len(dirty) != len(ix.Entries) {
		return nil, fmt.Errorf("the fsmonitor bitmap has %d bits for %d entries", len(dirty), len(ix.Entries))
	}
	fm.Dirty = dirty
	return fm, nil
}

// ewah serializes bits as Git's EWAH bitmap (ewah/ewah_io.c): the bit
// count, the number of 64-bit words, the words, and the position of the
// last run-length word. One run-length word (no run, every word literal:
// its literal count in bits 33 to 63) followed by the literal words is a
// valid encoding of any bitmap of fewer than 2^37 bits.
func ewah(bits []bool) []byte {
	words := make([]uint64, (len(bits)+63)/64)
	for i, b := range bits {
		if b {
			words[i/64] |= 1 << (i % 64)
		}
	}
	out := make([]byte, 0, 4+4+8*(1+len(words))+4)
	out = binary.BigEndian.AppendUint32(out, uint32(len(bits)))
	out = binary.BigEndian.AppendUint32(out, uint32(1+len(words)))
	out = binary.BigEndian.AppendUint64(out, uint64(len(words))<<33)
	for _, w := range words {
		out = binary.BigEndian.AppendUint64(out, w)
	}
	return binary.BigEndian.AppendUint32(out, 0)
}

// unewah reads an EWAH bitmap (ewah_read_mmap's layout, then the words as
// ewah_each_bit walks them: a run-length word, bit 0 the run's bit, bits
// 1 to 32 its length in words, bits 33 to 63 the literal words after it)
// into its bit count's bits. A bit set past the count, a word past the
// buffer or bytes left over are errors.
func unewah(p []byte) ([]bool, error) {
	be := binary.BigEndian
	if len(p) < 8 {
		return nil, errors.New("cut short")
	}
	nbits, nwords := be.Uint32(p), be.Uint32(p[4:])
	p = p[8:]
	if uint64(len(p)) != 8*uint64(nwords)+4 {
		return nil, errors.New("its size is not its word count's")
	}
	// Every word (run or literal) covers at least 64 bits, so a count the
	// words could not reach is refused before anything is allocated.
	if uint64(nbits) > 64*uint64(nwords) {
		return nil, fmt.Errorf("%d bits in %d words", nbits, nwords)
	}
	bits := make([]bool, nbits)
	set := func(i uint64) error {
		if i >= uint64(nbits) {
			return fmt.Errorf("bit %d set past the bitmap's %d", i, nbits)
		}
		bits[i] = true
		return nil
	}
	var pos uint64 // in bits
	for w := uint32(0); w < nwords; {
		rlw := be.Uint64(p[8*w:])
		w++
		run, literals := (rlw>>1)&0xffffffff, uint32(rlw>>33)
		if rlw&1 != 0 {
			if pos+64*run > uint64(nbits) {
				return nil, errors.New("a run of set bits past the bitmap")
			}
			for i := uint64(0); i < 64*run; i++ {
				bits[pos+i] = true
			}
		}
		pos += 64 * run
		if literals > nwords-w {
			return nil, errors.New("literal words past the buffer")
		}
		for k := uint32(0); k < literals; k++ {
			lit := be.Uint64(p[8*w:])
			w++
			for b := uint64(0); b < 64; b++ {
				if lit&(1<<b) != 0 {
					if err := set(pos + b); err != nil {
						return nil, err
					}
				}
			}
			pos += 64
		}
		// A run of zeros costs one word whatever its length: bounded
		// here, the position cannot overflow (a bit past the count is
		// refused by set).
		if pos > uint64(nbits)+64*uint64(nwords) {
			return nil, errors.New("words past the bitmap")
		}
	}
	return bits, nil
}
