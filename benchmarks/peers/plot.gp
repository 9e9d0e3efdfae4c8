# busbw against message size, one panel per process count, one line per backend and peer.
#
#   gnuplot -e "datadir='results/dat'; output='busbw.png'; subtitle='...'" plot.gp
#
# Reads the np<N>-<series>.dat files compare.py --dat writes (first line: size "series name").
if (!exists("datadir")) datadir = "."
if (!exists("output")) output = "busbw.png"
if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1500,620 font ",10" noenhanced
set output output
set logscale x 2
set xrange [2:134217728]
set logscale y 10
set xtics ("4" 4, "64" 64, "1K" 1024, "16K" 16384, "256K" 262144, "4M" 4194304, "64M" 67108864, "1G" 1073741824)
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
set xlabel "message size (bytes per rank)"
set ylabel "busbw (GB/s), in-place"
set format y "%g"
set key top left box opaque font ",9"
set key autotitle columnhead
set style data linespoints
# Series files sort cohort_* first: solid lines for cohort, dashed for the peers.
do for [i = 1:3] { set style line i lw 2 pt 7 ps 0.6 dt 1 }
do for [i = 4:9] { set style line i lw 1.5 pt 6 ps 0.6 dt 2 }
set style line 1 lc rgb "#1f77b4"
set style line 2 lc rgb "#d62728"
set style line 3 lc rgb "#2ca02c"
set style line 4 lc rgb "#9467bd"
set style line 5 lc rgb "#ff7f0e"
set style line 6 lc rgb "#8c564b"
set style line 7 lc rgb "#e377c2"
set style line 8 lc rgb "#7f7f7f"
set style line 9 lc rgb "#17becf"

ranks = system("ls ".datadir."/np*-*.dat 2>/dev/null | sed -e 's|.*/np||' -e 's|-.*||' | sort -n | uniq")
panels = words(ranks)
set multiplot layout 1, panels title "cohort-bench all_reduce against its peers, same machine, same run".(subtitle eq "" ? "" : "\n".subtitle)
do for [r in ranks] {
  files = system("ls ".datadir."/np".r."-*.dat | sort")
  set title sprintf("%s processes", r)
  plot for [i = 1:words(files)] word(files, i) using 1:2 ls i
}
unset multiplot
