package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	sdkclient "go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
)

const loopback = "127.0.0.1"

// devServerDynamicConfig is what `temporal server start-dev` sets over the
// server's defaults (temporalio/cli, internal/devserver): both modes have it.
func devServerDynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		dynamicconfig.HistoryCacheHostLevelMaxSize.Key():                 8096,
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,
	}
}

// tunedDynamicConfig is what -untuned leaves out; README.md says why each.
func tunedDynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		// One partition per task queue instead of 4: every poll and every
		// task meet on the root partition, so no task waits on a partition
		// that has no poller for the forwarder to move it to the root.
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
		// A new timer (here: an activity's 1 ms retry backoff) fires no
		// earlier than the timer queue's read cursor, which runs up to this
		// far ahead of now (default 1 s): with the default, a 1 ms backoff
		// takes up to a second.
		dynamicconfig.TimerProcessorMaxTimeShift.Key(): time.Millisecond,
		// History's task queues load new tasks from the store at most 20
		// times a second per shard by default, and the dev server has one
		// shard: back to back, a workflow's transfer tasks (dispatch its
		// workflow and activity tasks) and timers (the retry backoffs) wait
		// for that limiter. 10,000 leaves loading bound by the store only.
		dynamicconfig.TransferProcessorMaxPollRPS.Key():   10000,
		dynamicconfig.TimerProcessorMaxPollRPS.Key():      10000,
		dynamicconfig.VisibilityProcessorMaxPollRPS.Key(): 10000,
	}
}

// serverCmd runs Temporal's dev server in this process: all four services
// (frontend, history, matching, worker) on loopback, SQLite in memory, one
// history shard, the namespace "default" registered before start: what
// `temporal server start-dev` runs, without the UI.
func serverCmd(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	port := fs.Int("port", 7233, "frontend gRPC port on 127.0.0.1 (0: any free port)")
	pprofPort := fs.Int("pprof-port", 0, "serve net/http/pprof on 127.0.0.1 at this port (0: off)")
	untuned := fs.Bool("untuned", false, "the dev server's dynamic config only, none of this harness's tuning")
	extra := dynamicconfig.StaticClient{}
	fs.Func("dc", "one more dynamic config `KEY=VALUE` (repeatable; VALUE a bool, integer, float, duration or string), set last", func(kv string) error {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", kv)
		}
		extra[dynamicconfig.MakeKey(k)] = parseDynamicValue(v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *port == 0 {
		p, err := freePort()
		if err != nil {
			return err
		}
		*port = p
	}
	hostPort := net.JoinHostPort(loopback, strconv.Itoa(*port))
	logger := log.NewZapLogger(log.BuildZapLogger(log.Config{Level: "warn"})) // stderr, JSON

	conf, err := devServerConfig(*port)
	if err != nil {
		return err
	}
	conf.Global.PProf.Port = *pprofPort
	conf.Global.PProf.Host = loopback
	sqlConf := conf.Persistence.DataStores[sqliteplugin.PluginName].SQL
	nsConf, err := sqliteschema.NewNamespaceConfig(conf.ClusterMetadata.CurrentClusterName, namespace, false, nil)
	if err != nil {
		return fmt.Errorf("namespace config: %w", err)
	}
	// With mode=memory the plugin creates the schema on connect; this
	// connects, so it creates the schema, then writes the namespace.
	if err := sqliteschema.CreateNamespaces(sqlConf, nsConf); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}

	dc := devServerDynamicConfig()
	if !*untuned {
		for k, v := range tunedDynamicConfig() {
			dc[k] = v
		}
	}
	for k, v := range extra {
		dc[k] = v
	}
	authorizer, err := authorization.GetAuthorizerFromConfig(&conf.Global.Authorization)
	if err != nil {
		return err
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&conf.Global.Authorization, logger)
	if err != nil {
		return err
	}
	hosts := make(map[primitives.ServiceName]static.Hosts)
	for name, svc := range conf.Services {
		hosts[primitives.ServiceName(name)] = static.SingleLocalHost(net.JoinHostPort(loopback, strconv.Itoa(svc.RPC.GRPCPort)))
	}
	srv, err := temporal.NewServer(
		temporal.WithConfig(conf),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(hosts),
		temporal.WithLogger(logger),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dc),
	)
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start server: %w", err)
	}
	defer func() { _ = srv.Stop() }()

	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = waitStartable(readyCtx, hostPort, stderr)
	cancel()
	if err != nil {
		return fmt.Errorf("server not ready: %w", err)
	}
	fmt.Fprintf(stdout, "READY %s\n", hostPort)
	<-ctx.Done()
	return nil
}

// devServerConfig is the static config of a one-host cluster on loopback.
func devServerConfig(frontendPort int) (*config.Config, error) {
	var conf config.Config
	conf.Global.Membership.MaxJoinDuration = 30 * time.Second
	conf.Global.Membership.BroadcastAddress = loopback
	// No metrics listener: Global.Metrics nil.

	sqlConf := &config.SQL{
		PluginName: sqliteplugin.PluginName,
		// A private in-memory database, shared by this process's connections.
		ConnectAttributes: map[string]string{"mode": "memory", "cache": "shared"},
		DatabaseName:      "bench-" + strconv.FormatUint(rand.Uint64(), 36),
	}
	conf.Persistence.DefaultStore = sqliteplugin.PluginName
	conf.Persistence.VisibilityStore = sqliteplugin.PluginName
	conf.Persistence.NumHistoryShards = 1
	conf.Persistence.DataStores = map[string]config.DataStore{sqliteplugin.PluginName: {SQL: sqlConf}}

	const clusterName = "active"
	frontend := net.JoinHostPort(loopback, strconv.Itoa(frontendPort))
	conf.ClusterMetadata = &cluster.Config{
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {Enabled: true, InitialFailoverVersion: 1, RPCAddress: frontend},
		},
	}
	conf.DCRedirectionPolicy.Policy = "noop"
	conf.Services = make(map[string]config.Service, 4)
	for _, name := range []string{"frontend", "history", "matching", "worker"} {
		p := frontendPort
		if name != "frontend" {
			var err error
			if p, err = freePort(); err != nil {
				return nil, err
			}
		}
		var svc config.Service
		svc.RPC.GRPCPort = p
		svc.RPC.BindOnIP = loopback
		if name == "frontend" {
			// The HTTP API (and Nexus), as start-dev has it; unused here.
			hp, err := freePort()
			if err != nil {
				return nil, err
			}
			svc.RPC.HTTPPort = hp
		}
		conf.Services[name] = svc
	}
	conf.Archival.History.State = "disabled"
	conf.Archival.Visibility.State = "disabled"
	conf.NamespaceDefaults.Archival.History.State = "disabled"
	conf.NamespaceDefaults.Archival.Visibility.State = "disabled"
	// The server's own worker service (system workflows) dials this.
	conf.PublicClient.HostPort = frontend
	return &conf, nil
}

// parseDynamicValue reads a -dc value as true or false, else the first of
// integer, float, duration that it parses as, else as a string.
func parseDynamicValue(v string) any {
	switch v {
	case "true":
		return true
	case "false":
		return false
	}
	if i, err := strconv.Atoi(v); err == nil {
		return i
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	return v
}

// freePort returns a TCP port that was free on loopback a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitStartable returns once a client can start a workflow in the
// namespace: it starts one of a type no worker has, on a queue no worker
// polls, and terminates it. Until the namespace registry and the history
// shard are loaded, the start fails; it tries again every 50 ms.
func waitStartable(ctx context.Context, hostPort string, stderr io.Writer) error {
	c, err := sdkclient.DialContext(ctx, sdkclient.Options{
		HostPort: hostPort, Namespace: namespace, Logger: sdkLogger(stderr),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	id := "bench-ready-probe-" + strconv.FormatUint(rand.Uint64(), 36)
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		run, err := c.ExecuteWorkflow(attemptCtx, sdkclient.StartWorkflowOptions{
			ID: id, TaskQueue: "bench-ready-probe", WorkflowExecutionTimeout: time.Minute,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		}, "ReadyProbe")
		if err == nil {
			err = c.TerminateWorkflow(attemptCtx, id, run.GetRunID(), "ready probe")
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sdkLogger is the SDK's logger at warn level on stderr.
func sdkLogger(stderr io.Writer) sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}
