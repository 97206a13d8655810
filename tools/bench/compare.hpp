#pragma once

namespace sluice::bench {

// `sluice-bench compare ...`: runs one load against several targets in
// alternating rounds and prints a markdown table of medians, of the latency
// each target adds over the first one, and of the ratios between the added
// figures (each target's against --reference's, or the second target's
// against the third's). argv[first] is the first option
// after "compare". Returns the process exit code; throws UsageError.
int run_compare(int argc, char** argv, int first);

}  // namespace sluice::bench
