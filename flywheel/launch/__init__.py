"""``flywheel run`` and its parts: the plan, the children and their supervisor, the run folder and run.json,
the progress line, remote actors, and the services the command can start."""
