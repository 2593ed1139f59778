"""What writes and reads a run directory: the metric sinks and progress display (loggers.py), a checkpoint's
manifest (manifest.py), `cohort report` and `cohort compare` (report.py), and the one reader of a run's JSON Lines
files (jsonl.py). Imports nothing of cohort but `cohort.console`; torch only for the TensorBoard sink, matplotlib only when a plot
is drawn.
"""
