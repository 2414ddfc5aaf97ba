"""`make bench`: Inferno's benchmarks (not tests). Results are JSON under bench/results/."""
