package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/gateway"
)

func newGateway(g *globals) *cobra.Command {
	var listen, modelKey, mcpToken, modelCA string
	cmd := &cobra.Command{
		Use:   "gateway BUNDLE",
		Short: "Serve a bundle's model and MCP routes outside the agent's sandbox (a cluster's gateway; see docs/kubernetes.md)",
		Long: `gateway serves the private routes of one compiled bundle for a cluster
launch, where no launcher runs beside the agent's Pod: the model route (the
provider key added here, only the profile's requests, verified TLS to the
provider) and the MCP route (the daemon's bearer added here, the agent's
caller, methods and tools), each on its route port of --listen, with the
launcher's route proxies unchanged. The bundle is read once and verified as a
launch verifies it. The provider key and the MCP bearer are read once, at
start, from --model-key-file and --mcp-token-file (a Secret's key mounted with
subPath: a regular file, no symlink on its path, mode 0400 or 0440); each is
required when the bundle has its route and refused when it has not. Any
refusal (PP-GATEWAY-*) starts nothing. SIGTERM or SIGINT stops it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			// The MCP route's proxy forwards with net/http's default
			// transport, which takes a proxy from the environment: the
			// daemon's bearer goes to the route's upstream and nowhere else.
			for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
				os.Unsetenv(v)
			}
			o := gateway.Options{Bundle: args[0], ModelKeyFile: modelKey, MCPTokenFile: mcpToken}
			if a, err := netip.ParseAddr(listen); err == nil {
				o.Listen = a
			}
			if modelCA != "" {
				pem, err := readModelCA(modelCA)
				if err != nil {
					return exitWith(ExitUsage, err)
				}
				o.ModelRoots = x509.NewCertPool()
				o.ModelRoots.AppendCertsFromPEM(pem)
			}
			// Signals are caught before any port is taken: a SIGINT that
			// arrives once a route listens stops the gateway in order,
			// never by the signal's default action.
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			gw, err := gateway.Start(o)
			var ge *gateway.Error
			switch {
			case errors.As(err, &ge) && errors.Is(err, diag.GatewayListen) && ge.Path != "options.listen":
				// A port this host cannot give: the gateway cannot run here.
				return exitWith(ExitUnavailable, fmt.Errorf("%s", ge.Diagnostic()))
			case errors.As(err, &ge):
				return g.refuseWith(diag.List{ge.Diagnostic()}, "; nothing was served")
			case err != nil:
				return exitWith(ExitInternal, err)
			}
			for _, r := range gw.Routes {
				fmt.Fprintf(g.stderr, "paseo-policy: gateway: route %s on %s\n", r.Route.Purpose, r.Addr)
			}
			<-ctx.Done()
			for _, r := range gw.Routes {
				s := &r.Proxy.Stats
				fmt.Fprintf(g.stderr, "paseo-policy: gateway: route %s: %d forwarded, %d refused\n", r.Route.Purpose, s.Forwarded.Load(), s.Refused.Load())
			}
			if err := gw.Close(); err != nil {
				return exitWith(ExitInternal, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "IP address every route port is listened on (in a Pod: 0.0.0.0)")
	f.StringVar(&modelKey, "model-key-file", "", "file holding the model provider's key (a Secret's key mounted with subPath; 0400 or 0440)")
	f.StringVar(&mcpToken, "mcp-token-file", "", "file holding the daemon's MCP bearer (as --model-key-file)")
	f.StringVar(&modelCA, "model-ca", "", "PEM file of the CA certificates the model route verifies providers against, instead of the system trust store")
	return cmd
}
