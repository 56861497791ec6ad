// Stubborn from C++: a retry run followed live, dropped, reattached and
// decided.
//
// The run retries the demo delegate flaky-api, which fails its first two calls
// UNAVAILABLE, with no automatic retries and on_exhausted ASK: after each
// failure the run waits for a decision. The example prints every event as the
// server streams it (the Run server-streaming RPC), hangs up once the first
// attempt has started, reattaches with WatchRun(after_seq=last seen) (the run
// went on meanwhile; nothing is lost or repeated), answers each decision with
// DecideRun(RETRY), and exits 0 when the run ends SUCCEEDED.
//
//   stubborn delegates &    # a fresh one: flaky-api counts its calls
//   stubborn serve -config stubborn.yaml -listen 127.0.0.1:7300 &
//   make -C clients/cpp     # generates the client from proto/ and builds build/example
//   clients/cpp/build/example --addr 127.0.0.1:7300
//
// The address is --addr, else STUBBORN_ADDR, else 127.0.0.1:7300. An attempt
// that streams its output (attempt_output events: --target names a delegate
// that streams) is printed as it comes, in a block that begins on the first
// piece's event line and ends with a line naming the events it held, as the
// Python and TypeScript examples print it:
//
//     6 10:48:56.791 attempt_output     attempt 1 | Here is
//   -- attempt 1 streamed 7 bytes in seq 6-7
//     8 10:48:57.050 attempt_finished   attempt 1 <- model: ERROR UNAVAILABLE "reset" [output discarded]

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "stubborn/v1/control.grpc.pb.h"

namespace pb = stubborn::v1;

namespace {

// The gRPC status code's name, as google.rpc.Code numbers them.
std::string CodeName(int code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",         "UNKNOWN",            "INVALID_ARGUMENT",    "DEADLINE_EXCEEDED",
      "NOT_FOUND",    "ALREADY_EXISTS",    "PERMISSION_DENIED",  "RESOURCE_EXHAUSTED",  "FAILED_PRECONDITION",
      "ABORTED",      "OUT_OF_RANGE",      "UNIMPLEMENTED",      "INTERNAL",            "UNAVAILABLE",
      "DATA_LOSS",    "UNAUTHENTICATED",
  };
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return std::to_string(code);
}

// An enum value's name without its prefix: RUN_STATUS_SUCCEEDED is SUCCEEDED.
std::string Short(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
}

std::string Status(pb::RunStatus s) { return Short(pb::RunStatus_Name(s), "RUN_STATUS_"); }

int64_t Millis(const google::protobuf::Duration& d) { return d.seconds() * 1000 + d.nanos() / 1000000; }

// A string in double quotes, with quotes, backslashes and control characters escaped.
std::string Quote(const std::string& s) {
  std::string q = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\n': q += "\\n"; break;
      case '\t': q += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          q += buf;
        } else {
          q += static_cast<char>(c);
        }
    }
  }
  return q + "\"";
}

// The name of the event's kind (the set field of the oneof), or "unknown".
std::string Kind(const pb::RunEvent& event) {
  if (event.kind_case() == pb::RunEvent::KIND_NOT_SET) return "unknown";
  const auto* field = pb::RunEvent::descriptor()->FindFieldByNumber(event.kind_case());
  return field ? field->name() : "unknown";
}

// An event line's start: seq, time (UTC), kind.
std::string Head(const pb::RunEvent& event) {
  std::time_t secs = event.time().seconds();
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char clock[16];
  std::strftime(clock, sizeof clock, "%H:%M:%S", &tm);
  char line[128];
  std::snprintf(line, sizeof line, "%3lld %s.%03d %-18s", static_cast<long long>(event.seq()), clock,
                event.time().nanos() / 1000000, Kind(event).c_str());
  return line;
}

// One line: seq, time (UTC), kind, and what happened.
std::string Describe(const pb::RunEvent& event) {
  std::ostringstream text;
  switch (event.kind_case()) {
    case pb::RunEvent::kRunStarted:
      text << "run " << event.run_id() << " started: " << Quote(event.run_started().state().task_brief());
      break;
    case pb::RunEvent::kAttemptStarted: {
      const auto& a = event.attempt_started().attempt();
      text << "attempt " << a.number() << " -> " << a.delegate();
      if (a.has_wait_before()) text << " after waiting " << Millis(a.wait_before()) << "ms";
      break;
    }
    case pb::RunEvent::kAttemptFinished: {
      const auto& a = event.attempt_finished().attempt();
      text << "attempt " << a.number() << " <- " << a.delegate() << ": "
           << Short(pb::AttemptOutcome_Name(a.outcome()), "ATTEMPT_OUTCOME_");
      if (a.has_error()) {
        text << " " << CodeName(a.error().code()) << " " << Quote(a.error().message());
      } else if (a.has_result()) {
        text << " " << Quote(a.result().text());
      }
      if (event.attempt_finished().output_discarded()) text << " [output discarded]";
      break;
    }
    case pb::RunEvent::kFailureAnalyzed: {
      const auto& e = event.failure_analyzed();
      text << "attempt " << e.failure().attempt() << " failed: " << e.failure().reason() << "; ";
      if (e.will_retry()) {
        text << "retrying";
      } else {
        text << "not retried: " << e.failure().not_retried_reason();
      }
      break;
    }
    case pb::RunEvent::kBackoffScheduled:
      text << "waiting " << Millis(event.backoff_scheduled().wait()) << "ms before attempt "
           << event.backoff_scheduled().next_attempt();
      break;
    case pb::RunEvent::kDecisionRequested:
      text << "awaiting a decision: " << event.decision_requested().reason();
      break;
    case pb::RunEvent::kDecisionReceived:
      text << "decision: " << Short(pb::Decision_Name(event.decision_received().decision()), "DECISION_");
      break;
    case pb::RunEvent::kRunResumed:
      text << "resumed by " << event.run_resumed().owner() << ": " << event.run_resumed().reason();
      break;
    case pb::RunEvent::kRunFinished:
      text << Status(event.run_finished().state().status()) << " after " << event.run_finished().state().attempts()
           << " attempt(s)";
      break;
    default:
      text << "an event this client does not know";
  }
  return Head(event) + " " + text.str();
}

// Prints a run's events, checking that seq runs 1, 2, 3, ... An attempt's
// streamed text (attempt_output) is written as it comes, each piece at once
// with no newline of its own, in a block: its first line is the first piece's
// event line, with "| " before the text; the text's own line breaks start
// lines with "| " under it. The block ends, with a line "-- attempt N streamed
// B bytes in seq F-L", before anything else is printed: another event,
// another attempt's text, a note.
class Printer {
 public:
  int64_t last_seq() const { return last_seq_; }

  void Show(const pb::RunEvent& event) {
    if (event.seq() != last_seq_ + 1) {
      std::cerr << "event seq " << event.seq() << " after " << last_seq_ << ": a gap or a duplicate\n";
      std::exit(1);
    }
    last_seq_ = event.seq();
    if (event.has_attempt_output()) {
      Output(event);
    } else {
      EndBlock();
      std::cout << Describe(event) << std::endl;
    }
  }

  // One of the example's own lines: "-- text".
  void Note(const std::string& text) {
    EndBlock();
    std::cout << "-- " << text << std::endl;
  }

  void EndBlock() {
    if (!block_) return;
    if (line_open_) std::cout << "\n";
    std::cout << "-- " << Label(*block_) << " streamed " << bytes_ << " bytes in seq " << first_ << "-" << last_
              << std::endl;
    block_.reset();
    line_open_ = false;
  }

 private:
  using Key = std::pair<std::string, int32_t>;  // (path, attempt)

  static std::string Label(const Key& key) {
    std::string attempt = "attempt " + std::to_string(key.second);
    return key.first.empty() ? attempt : "[" + key.first + "] " + attempt;
  }

  void Output(const pb::RunEvent& event) {
    const auto& o = event.attempt_output();
    Key key{event.path(), o.attempt()};
    int64_t printed = printed_[key];
    if (block_ != key || o.offset() != printed) {
      EndBlock();
      std::string label = Label(key);
      if (o.offset() != printed) label += " from byte " + std::to_string(o.offset());  // text before it never seen here
      if (o.provisional()) label += " (provisional)";  // failure criteria have yet to rule on it
      std::string start = Head(event) + " " + label + " | ";
      std::cout << start;
      margin_ = std::string(start.size() - 2, ' ') + "| ";
      block_ = key;
      first_ = event.seq();
      bytes_ = 0;
      line_open_ = true;
    }
    const std::string& text = o.text();
    size_t from = 0;
    for (bool first_line = true;; first_line = false) {
      size_t nl = text.find('\n', from);
      std::string line = text.substr(from, nl == std::string::npos ? std::string::npos : nl - from);
      if (!first_line) {
        std::cout << (line_open_ ? "" : margin_.substr(0, margin_.size() - 1)) << "\n";
        line_open_ = false;
      }
      if (!line.empty()) {
        if (!line_open_) std::cout << margin_;
        line_open_ = true;
        std::cout << line;
      }
      if (nl == std::string::npos) break;
      from = nl + 1;
    }
    std::cout.flush();
    last_ = event.seq();
    bytes_ += static_cast<int64_t>(text.size());
    printed_[key] = o.offset() + static_cast<int64_t>(text.size());
  }

  int64_t last_seq_ = 0;
  std::optional<Key> block_;        // the open block, if any
  int64_t first_ = 0, last_ = 0;    // the open block's first and last seq
  int64_t bytes_ = 0;               // the open block's bytes
  std::string margin_;              // what starts each later line of the block
  bool line_open_ = false;          // the block's last line has yet to end
  std::map<Key, int64_t> printed_;  // bytes of each attempt's text printed
};

[[noreturn]] void Fail(const std::string& what, const grpc::Status& status, const std::string& addr) {
  std::cerr << what << ": " << CodeName(status.error_code()) << ": " << status.error_message()
            << " (is `stubborn serve` running on " << addr << "? --addr or STUBBORN_ADDR)\n";
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const char* env_addr = std::getenv("STUBBORN_ADDR");
  std::string addr = env_addr && *env_addr ? env_addr : "127.0.0.1:7300";
  std::string target = "flaky-api";
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::optional<std::string> {
      if (arg.compare(0, flag.size() + 1, flag + "=") == 0) return arg.substr(flag.size() + 1);
      if (arg == flag) {
        if (i + 1 >= argc) {
          std::cerr << flag << " needs a value\n";
          std::exit(2);
        }
        return std::string(argv[++i]);
      }
      return std::nullopt;
    };
    if (auto v = value("--addr")) {
      addr = *v;
    } else if (auto v = value("--target")) {
      target = *v;
    } else {
      std::cerr << "usage: " << argv[0] << " [--addr HOST:PORT] [--target DELEGATE]\n"
                << "  --addr: Stubborn server (default STUBBORN_ADDR or 127.0.0.1:7300)\n"
                << "  --target: delegate to retry (default flaky-api)\n";
      return 2;
    }
  }

  auto stub = pb::ControlService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  Printer out;

  // Start the run and follow it live; hang up once the first attempt has started.
  pb::RunRequest request;
  request.set_task_brief("fetch the quarterly numbers");
  auto* retry = request.mutable_retry();
  retry->set_target(target);
  retry->set_attempts(0);  // no automatic retry: every failure asks for a decision
  retry->set_on_exhausted(pb::ON_EXHAUSTED_ASK);
  retry->mutable_base_wait()->set_nanos(100000000);
  retry->mutable_max_wait()->set_seconds(1);

  std::string run_id;
  {
    grpc::ClientContext ctx;
    auto stream = stub->Run(&ctx, request);
    pb::RunResponse response;
    bool hung_up = false;
    while (stream->Read(&response)) {
      out.Show(response.event());
      run_id = response.event().run_id();
      if (response.event().has_attempt_started()) {
        ctx.TryCancel();
        hung_up = true;
        break;
      }
    }
    grpc::Status status = stream->Finish();  // CANCELLED after the hang-up
    if (!hung_up) {
      if (!status.ok()) Fail("Run", status, addr);
      std::cerr << "the Run stream ended before an attempt started\n";
      return 1;
    }
  }
  out.Note("hung up after seq " + std::to_string(out.last_seq()) + "; the run goes on without a watcher");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  // Reattach after the last event seen, and answer each decision.
  out.Note("reattaching: WatchRun(run_id=" + run_id + ", after_seq=" + std::to_string(out.last_seq()) + ")");
  std::optional<pb::ControlState> final_state;
  {
    grpc::ClientContext ctx;
    pb::WatchRunRequest watch;
    watch.set_run_id(run_id);
    watch.set_after_seq(out.last_seq());
    auto stream = stub->WatchRun(&ctx, watch);
    pb::WatchRunResponse response;
    while (stream->Read(&response)) {
      const auto& event = response.event();
      out.Show(event);
      if (event.has_decision_requested()) {
        grpc::ClientContext decide_ctx;
        pb::DecideRunRequest decide;
        decide.set_run_id(run_id);
        decide.set_decision(pb::DECISION_RETRY);
        pb::DecideRunResponse decided;
        grpc::Status status = stub->DecideRun(&decide_ctx, decide, &decided);
        if (!status.ok()) Fail("DecideRun", status, addr);
        out.Note("DecideRun(RETRY): run is " + Status(decided.state().status()));
      } else if (event.has_run_finished()) {
        final_state = event.run_finished().state();
      }
    }
    grpc::Status status = stream->Finish();
    if (!status.ok()) Fail("WatchRun", status, addr);
  }
  out.EndBlock();

  if (!final_state) {
    std::cerr << "the stream ended without run_finished\n";
    return 1;
  }
  std::cout << "final status: " << Status(final_state->status()) << " after " << final_state->attempts()
            << " attempts, winner " << final_state->winner() << ", result " << Quote(final_state->result().text())
            << std::endl;
  return final_state->status() == pb::RUN_STATUS_SUCCEEDED ? 0 : 1;
}
