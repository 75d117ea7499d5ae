"""Parts the bench suites share (loops, rows, plots, the scale model): public, so tests import them too."""
