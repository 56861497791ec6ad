package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"go.temporal.io/sdk/activity"
	sdkclient "go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Scenarios: the workflow's second argument.
const (
	scenarioOne    = "one"    // the echo delegate, one attempt
	scenarioRetry3 = "retry3" // the flaky delegate, three attempts 1 ms apart
)

// retryPolicy is the activity's retry policy for a scenario.
func retryPolicy(scenario string) (*temporal.RetryPolicy, error) {
	switch scenario {
	case scenarioOne:
		return &temporal.RetryPolicy{MaximumAttempts: 1}, nil
	case scenarioRetry3:
		// Waits of 1 ms between attempts: a coefficient of 1 keeps every
		// wait at InitialInterval (Stubborn's retry scenario waits 0).
		return &temporal.RetryPolicy{
			InitialInterval:    time.Millisecond,
			BackoffCoefficient: 1,
			MaximumInterval:    time.Millisecond,
			MaximumAttempts:    3,
		}, nil
	}
	return nil, fmt.Errorf("unknown scenario %q (want %s or %s)", scenario, scenarioOne, scenarioRetry3)
}

// RunWorkflow is the workflow "Run": one activity, "Execute", which calls
// the scenario's delegate once per attempt; its answer is the result.
func RunWorkflow(ctx workflow.Context, brief, scenario string) (string, error) {
	rp, err := retryPolicy(scenario)
	if err != nil {
		return "", temporal.NewNonRetryableApplicationError(err.Error(), "BadScenario", nil)
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         rp,
	})
	var text string
	err = workflow.ExecuteActivity(ctx, activityName, brief, scenario).Get(ctx, &text)
	return text, err
}

// delegateActivity calls Execute on a delegate over one shared connection
// per delegate.
type delegateActivity struct {
	echo, flaky *grpc.ClientConn
}

// Execute is the activity: one Execute call, with the activity's attempt
// number (1, 2, 3, ...) and the workflow's run id. A delegate's error
// fails the attempt; the workflow's retry policy decides what follows.
func (a *delegateActivity) Execute(ctx context.Context, brief, scenario string) (string, error) {
	cc := a.echo
	if scenario == scenarioRetry3 {
		cc = a.flaky
	}
	info := activity.GetInfo(ctx)
	req := &executeRequest{Brief: brief, RunID: info.WorkflowExecution.RunID, Attempt: info.Attempt}
	resp := new(executeResponse)
	if err := cc.Invoke(ctx, executeMethod, req, resp, grpc.ForceCodec(wireCodec{})); err != nil {
		return "", err
	}
	return resp.Text, nil
}

// workerOptions is the worker's tuning; untuned is the SDK's defaults.
// README.md says why each is set.
func workerOptions(untuned bool) worker.Options {
	if untuned {
		return worker.Options{}
	}
	return worker.Options{
		// Enough polls waiting on the server that a task is matched to a
		// poll at once at concurrency 32, rather than waiting for a poller
		// to come back (the default is 2 of each).
		MaxConcurrentWorkflowTaskPollers: 8,
		MaxConcurrentActivityTaskPollers: 8,
	}
}

func workerCmd(ctx context.Context, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	hostPort := fs.String("temporal", "", "Temporal frontend HOST:PORT")
	echoAddr := fs.String("delegate", "", "echo delegate HOST:PORT (scenario one)")
	flakyAddr := fs.String("flaky-delegate", "", "fail-first-2 delegate HOST:PORT (scenario retry3)")
	untuned := fs.Bool("untuned", false, "the SDK's default worker options")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *hostPort == "" || *echoAddr == "" || *flakyAddr == "" {
		return errors.New("worker needs -temporal, -delegate and -flaky-delegate")
	}
	echo, err := grpc.NewClient(*echoAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer echo.Close()
	flaky, err := grpc.NewClient(*flakyAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer flaky.Close()

	c, err := sdkclient.DialContext(ctx, sdkclient.Options{HostPort: *hostPort, Namespace: namespace, Logger: sdkLogger(stderr)})
	if err != nil {
		return fmt.Errorf("dial %s: %w", *hostPort, err)
	}
	defer c.Close()
	w := worker.New(c, taskQueue, workerOptions(*untuned))
	w.RegisterWorkflowWithOptions(RunWorkflow, workflow.RegisterOptions{Name: workflowName})
	w.RegisterActivityWithOptions((&delegateActivity{echo: echo, flaky: flaky}).Execute, activity.RegisterOptions{Name: activityName})
	if err := w.Start(); err != nil { // returns once its pollers have started
		return fmt.Errorf("start worker: %w", err)
	}
	defer w.Stop()
	fmt.Fprintln(stdout, "READY")
	<-ctx.Done()
	return nil
}
