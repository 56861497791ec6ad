#!/usr/bin/ruby
# frozen_string_literal: true

# Stubborn from Ruby: a retry run followed live, dropped, reattached and
# decided.
#
# The run retries the demo delegate flaky-api, which fails its first two calls
# UNAVAILABLE, with no automatic retries and on_exhausted ASK: after each
# failure the run waits for a decision. The example prints every event as the
# server streams it (the Run server-streaming RPC), hangs up once the first
# attempt has started, reattaches with WatchRun(after_seq=last seen) (the run
# went on meanwhile; nothing is lost or repeated), answers each decision with
# DecideRun(RETRY), and exits 0 when the run ends SUCCEEDED.
#
#   stubborn delegates &    # a fresh one: flaky-api counts its calls
#   stubborn serve -config stubborn.yaml -listen 127.0.0.1:7300 &
#   make -C clients/ruby    # generates clients/ruby/lib from proto/
#   ruby clients/ruby/example.rb --addr 127.0.0.1:7300
#
# The address is --addr, else STUBBORN_ADDR, else 127.0.0.1:7300. An attempt
# that streams its output (attempt_output events: --target names a delegate
# that streams) is printed as it comes, in a block that begins on the first
# piece's event line and ends with a line naming the events it held, as the
# Python and TypeScript examples print it:
#
#     6 10:48:56.791 attempt_output     attempt 1 | Here is
#   -- attempt 1 streamed 7 bytes in seq 6-7
#     8 10:48:57.050 attempt_finished   attempt 1 <- model: ERROR UNAVAILABLE "reset" [output discarded]

require "optparse"

$LOAD_PATH.unshift(File.join(__dir__, "lib"))
begin
  require "grpc"
  require "google/protobuf/well_known_types"
  require "stubborn/v1/control_services_pb"
rescue LoadError => e
  abort "#{e.message}: install ruby-grpc and ruby-google-protobuf, and run `make` in #{__dir__} to generate lib/"
end

PB = Stubborn::V1
CODE_NAMES = GRPC::Core::StatusCodes.constants.to_h { |c| [GRPC::Core::StatusCodes.const_get(c), c.to_s] }

# An enum value without its prefix: RUN_STATUS_SUCCEEDED is SUCCEEDED.
def short(value, prefix)
  value.to_s.delete_prefix(prefix)
end

def millis(duration)
  duration.seconds * 1000 + duration.nanos / 1_000_000
end

# One line: seq, time (UTC), kind, and what happened.
def describe(event)
  kind = event.kind
  e = kind && event.public_send(kind)
  text =
    case kind
    when :run_started
      "run #{event.run_id} started: #{e.state.task_brief.inspect}"
    when :attempt_started
      a = e.attempt
      s = "attempt #{a.number} -> #{a.delegate}"
      s += " after waiting #{millis(a.wait_before)}ms" if a.wait_before
      s
    when :attempt_finished
      a = e.attempt
      s = "attempt #{a.number} <- #{a.delegate}: #{short(a.outcome, 'ATTEMPT_OUTCOME_')}"
      if a.error
        s += " #{CODE_NAMES.fetch(a.error.code, a.error.code)} #{a.error.message.inspect}"
      elsif a.result
        s += " #{a.result.text.inspect}"
      end
      s += " [output discarded]" if e.output_discarded
      s
    when :failure_analyzed
      f = e.failure
      "attempt #{f.attempt} failed: #{f.reason}; " +
        (e.will_retry ? "retrying" : "not retried: #{f.not_retried_reason}")
    when :backoff_scheduled
      "waiting #{millis(e.wait)}ms before attempt #{e.next_attempt}"
    when :decision_requested
      "awaiting a decision: #{e.reason}"
    when :decision_received
      "decision: #{short(e.decision, 'DECISION_')}"
    when :run_resumed
      "resumed by #{e.owner}: #{e.reason}"
    when :run_finished
      "#{short(e.state.status, 'RUN_STATUS_')} after #{e.state.attempts} attempt(s)"
    else
      "an event this client does not know"
    end
  "#{head(event)} #{text}"
end

# An event line's start: seq, time (UTC), kind.
def head(event)
  clock = Time.at(event.time.seconds, event.time.nanos, :nsec).utc.strftime("%H:%M:%S.%L")
  format("%3d %s %-18s", event.seq, clock, event.kind || "unknown")
end

# Prints a run's events, checking that seq runs 1, 2, 3, ... An attempt's
# streamed text (attempt_output) is written as it comes, each piece at once
# with no newline of its own, in a block: its first line is the first piece's
# event line, with "| " before the text; the text's own line breaks start
# lines with "| " under it. The block ends, with a line "-- attempt N streamed
# B bytes in seq F-L", before anything else is printed: another event,
# another attempt's text, a note.
class Printer
  attr_reader :last_seq

  def initialize
    @last_seq = 0
    @block = nil # [path, attempt] of the open block, or nil
    @first = @last = @bytes = 0 # the open block's first and last seq, bytes
    @margin = "" # what starts each later line of the block
    @line_open = false # the block's last line has yet to end
    @printed = Hash.new(0) # [path, attempt] => bytes of its text printed
  end

  def show(event)
    abort "event seq #{event.seq} after #{@last_seq}: a gap or a duplicate" if event.seq != @last_seq + 1
    @last_seq = event.seq
    if event.kind == :attempt_output
      output(event)
    else
      end_block
      puts describe(event)
    end
  end

  # One of the example's own lines: "-- text".
  def note(text)
    end_block
    puts "-- #{text}"
  end

  def output(event)
    o = event.attempt_output
    key = [event.path, o.attempt]
    if key != @block || o.offset != @printed[key]
      end_block
      label = label(*key)
      label += " from byte #{o.offset}" if o.offset != @printed[key] # text before it never seen here
      label += " (provisional)" if o.provisional # failure criteria have yet to rule on it
      start = "#{head(event)} #{label} | "
      $stdout.write(start)
      @margin = "#{' ' * (start.length - 2)}| "
      @block, @first, @bytes, @line_open = key, event.seq, 0, true
    end
    o.text.split("\n", -1).each_with_index do |line, i|
      if i.positive?
        $stdout.write("#{@line_open ? '' : @margin.rstrip}\n")
        @line_open = false
      end
      next if line.empty?

      $stdout.write(@margin) unless @line_open
      @line_open = true
      $stdout.write(line)
    end
    @last = event.seq
    @bytes += o.text.bytesize
    @printed[key] = o.offset + o.text.bytesize
  end

  def end_block
    return unless @block

    $stdout.write("\n") if @line_open
    puts "-- #{label(*@block)} streamed #{@bytes} bytes in seq #{@first}-#{@last}"
    @block = nil
    @line_open = false
  end

  private

  def label(path, attempt)
    path.empty? ? "attempt #{attempt}" : "[#{path}] attempt #{attempt}"
  end
end

def main
  addr = ENV.fetch("STUBBORN_ADDR", "").then { |a| a.empty? ? "127.0.0.1:7300" : a }
  target = "flaky-api"
  OptionParser.new do |o|
    o.banner = "usage: example.rb [--addr HOST:PORT] [--target DELEGATE]"
    o.on("--addr ADDR", "Stubborn server (host:port; default STUBBORN_ADDR or 127.0.0.1:7300)") { |v| addr = v }
    o.on("--target NAME", "delegate to retry (default flaky-api)") { |v| target = v }
  end.parse!
  $stdout.sync = true

  stub = PB::ControlService::Stub.new(addr, :this_channel_is_insecure)
  out = Printer.new

  # Start the run and follow it live; hang up once the first attempt has started.
  request = PB::RunRequest.new(
    task_brief: "fetch the quarterly numbers",
    retry: PB::RetrySpec.new(
      target: target,
      attempts: 0, # no automatic retry: every failure asks for a decision
      on_exhausted: :ON_EXHAUSTED_ASK,
      base_wait: Google::Protobuf::Duration.new(nanos: 100_000_000),
      max_wait: Google::Protobuf::Duration.new(seconds: 1),
    ),
  )
  call = stub.run(request, return_op: true)
  run_id = nil
  call.execute.each do |response|
    out.show(response.event)
    run_id = response.event.run_id
    break if response.event.kind == :attempt_started
  end
  call.cancel
  out.note("hung up after seq #{out.last_seq}; the run goes on without a watcher")
  sleep 0.5

  # Reattach after the last event seen, and answer each decision.
  out.note("reattaching: WatchRun(run_id=#{run_id}, after_seq=#{out.last_seq})")
  final = nil
  stub.watch_run(PB::WatchRunRequest.new(run_id: run_id, after_seq: out.last_seq)).each do |response|
    event = response.event
    out.show(event)
    case event.kind
    when :decision_requested
      decided = stub.decide_run(PB::DecideRunRequest.new(run_id: run_id, decision: :DECISION_RETRY))
      out.note("DecideRun(RETRY): run is #{short(decided.state.status, 'RUN_STATUS_')}")
    when :run_finished
      final = event.run_finished.state
    end
  end
  out.end_block

  abort "the stream ended without run_finished" unless final
  puts "final status: #{short(final.status, 'RUN_STATUS_')} after #{final.attempts} attempts, " \
       "winner #{final.winner}, result #{final.result&.text.inspect}"
  final.status == :RUN_STATUS_SUCCEEDED ? 0 : 1
rescue GRPC::BadStatus => e
  abort "#{CODE_NAMES.fetch(e.code, e.code)}: #{e.details} (is `stubborn serve` running on #{addr}? --addr or STUBBORN_ADDR)"
end

exit(main) if $PROGRAM_NAME == __FILE__
