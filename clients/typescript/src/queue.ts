// A single-consumer async queue with an end (or a failure), for events and records.

export class AsyncQueue<T> implements AsyncIterableIterator<T> {
  private items: T[] = [];
  private waiters: Array<{ resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void }> = [];
  private ended = false;
  private failure: unknown = undefined;
  /** Called after an item was taken, with the queue's new length (flow control). */
  onTake: ((length: number) => void) | undefined;

  get length(): number {
    return this.items.length;
  }

  push(item: T): void {
    if (this.ended) return;
    const w = this.waiters.shift();
    if (w) {
      w.resolve({ value: item, done: false });
      this.onTake?.(this.items.length);
      return;
    }
    this.items.push(item);
  }

  /** Ends the queue: queued items are still delivered, then done (or err thrown). */
  end(err?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.failure = err;
    for (const w of this.waiters.splice(0)) {
      if (err !== undefined) w.reject(err);
      else w.resolve({ value: undefined, done: true });
    }
  }

  next(): Promise<IteratorResult<T>> {
    if (this.items.length > 0) {
      const value = this.items.shift() as T;
      this.onTake?.(this.items.length);
      return Promise.resolve({ value, done: false });
    }
    if (this.ended) {
      return this.failure !== undefined ? Promise.reject(this.failure) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  return(): Promise<IteratorResult<T>> {
    this.end();
    this.items = [];
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> {
    return this;
  }
}
