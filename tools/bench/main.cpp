// sluice-bench: an HTTP load generator for OpenAI-compatible endpoints that
// measures time to first byte, total time and the gaps between streamed
// events, in closed loop (fixed concurrency) or open loop (fixed rate, latency
// counted from the scheduled start), and compares several targets.

#include <iostream>
#include <string>
#include <string_view>

#include "compare.hpp"
#include "load_runner.hpp"
#include "options.hpp"
#include "report.hpp"

namespace {

using namespace sluice::bench;

constexpr int kUsageError = 2;

constexpr std::string_view kUsage =
    R"(usage: sluice-bench --url URL --model NAME [load options] [--json FILE] [--hdr-out FILE]
       sluice-bench compare --target NAME=URL... [--rounds N] [load options]
                    [--cpu-pid NAME=PID[,PID...]] [--title TEXT] [--description TEXT]
                    [--json FILE] [--samples PREFIX] [--reference NAME] [--stall-probe]

Load options:
  --url URL              http://host:port/path to POST to (single run)
  --model NAME           model name in the generated body
  --stream               ask for a server-sent event stream
  --concurrency N, -c N  closed loop: N connections, each sending the next request
                         as soon as the previous one ends (default 1)
  --rate R               open loop: R requests/s on a fixed schedule; latency is
                         measured from the scheduled start, so a stall delays and is
                         charged to every request behind it
  --max-connections N    open loop: connections are opened as needed up to N (1024)
  --duration DUR         measured time (default 5s); requests started before the end
                         are allowed to finish
  --requests N, -n N     measure N requests instead of a duration
  --warmup DUR           unmeasured time before measuring (default 1s)
  --ramp DUR             closed loop: start the N connections evenly over DUR
                         instead of all at once (e.g. streams out of step); each
                         connection keeps its place: a request waits for the
                         connection's next slot (its offset plus whole DURs)
  --pause-after-error DUR
                         closed loop: a connection whose answer had an error status
                         waits DUR before its next request, as a client backing off
  --timeout DUR          per-request limit (default 30s)
  --header 'k: v', -H    extra request header (repeatable)
  --body-file FILE       send this body instead of a generated one
  --threads T            load generator threads, each with its own event loop (1)

Streams whose events the mock stamps with its send time (-H 'x-mock-stamp: 1';
the mock on this machine) also report each event's delay (the mock's write to
its arrival here) and gap stretch (how much longer each gap arrived than it
was sent): what the path adds per token, free of the mock's own timer jitter.

Output:
  --json FILE            also write the results as JSON
  --hdr-out FILE         write the cumulative distributions (gnuplot data sets:
                         index 0 TTFT, 1 total, 2 gap; microseconds, fraction)

Compare:
  --target NAME=URL      a target; the first one is the baseline (repeatable)
  --rounds N             rounds; each runs every target once, starting one target
                         later than the round before (default 3)
  --cpu-pid NAME=PIDS    charge these processes' CPU time to target NAME
  --title TEXT           heading of the printed table
  --description TEXT     a paragraph printed under the heading
  --samples PREFIX       write PREFIX<NAME>.cdf distributions of all rounds
  --reference NAME       ratio columns: each other target's added figures over
                         NAME's (default: the second target's over the third's)
  --stall-probe          watch every CPU for stalls while each target runs (a
                         thread per CPU, waking every 250 µs) and report the TTFT
                         and gap stretch of the samples no stall overlapped
                         beside those of all of them

TTFT is the time to the first body byte (the first event of a stream). Gaps
are the times between the ends of consecutive server-sent events. Times are
printed in microseconds. Durations: 500ms, 5s, 1.5s, 1m (a bare number is seconds).
)";

int run_single(int argc, char** argv) {
  LoadOptions options;
  std::string url_text;
  std::string json_path;
  std::string cdf_path;
  ArgumentCursor cursor(argc, argv, 1);
  while (cursor.next()) {
    const std::string_view name = cursor.name();
    if (parse_load_option(cursor, options)) continue;
    if (name == "--url") {
      url_text = std::string(cursor.value());
    } else if (name == "--json") {
      json_path = std::string(cursor.value());
    } else if (name == "--hdr-out") {
      cdf_path = std::string(cursor.value());
    } else {
      throw UsageError{"unknown option '" + std::string(name) + "'"};
    }
  }
  if (url_text.empty()) throw UsageError{"--url is required"};
  std::string why;
  auto url = parse_http_url(url_text, why);
  if (!url) throw UsageError{"--url: " + why};
  validate(options);

  const std::string request = build_request(*url, options);
  const RunResult result = run_load(*url, options, request);
  const RunSummary summary = summarize(result);
  print_run(std::cout, url_text, options, summary);
  if (!cdf_path.empty()) write_cdf_file(cdf_path, result);
  if (!json_path.empty()) {
    nlohmann::json document = to_json(summary);
    document["url"] = url_text;
    document["load"] = describe(options);
    write_json_file(json_path, document);
  }
  // Exit status tells scripts whether anything was measured at all.
  return summary.ok > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--help" || argument == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  try {
    if (argc >= 2 && std::string_view(argv[1]) == "compare") return run_compare(argc, argv, 2);
    return run_single(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "sluice-bench: " << error.message << "\n(see sluice-bench --help)\n";
    return kUsageError;
  }
}
