# Draws bench/out/latency.png: one panel per scenario, the cumulative
# distribution of TTFT for each target on a log time axis. bench/run calls it
# with: outdir='DIR'; scenarios='a b c'; targets='direct sluice nginx'.
# The data sets come from `sluice-bench compare --samples`: index 0 of each
# file is TTFT (microseconds, cumulative fraction).

panels = words(scenarios)
set terminal pngcairo size (520 * panels), 460 font "sans,10" noenhanced
set output outdir . "/latency.png"
set multiplot layout 1, panels title "Time to first byte: cumulative distribution, all rounds (log time axis)"
set logscale x 10
set format x "%g"
set xlabel "TTFT (µs)"
set ylabel "fraction of requests"
set yrange [0:1]
set ytics 0.1
set grid xtics mxtics ytics
set key bottom right
do for [scenario in scenarios] {
  set title scenario
  plot for [target in targets] \
    sprintf("%s/samples/%s-%s.cdf", outdir, scenario, target) index 0 using 1:2 \
    with lines linewidth 2 title target
}
unset multiplot
