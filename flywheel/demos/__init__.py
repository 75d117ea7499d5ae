"""Demonstrations: the versioned file format replay loads its demonstrations table from."""

from .format import FORMAT, VERSION, DemoEpisode, DemoFileError, DemoSet, DemoWriter, nstep_transitions, open_demos

__all__ = ["FORMAT", "VERSION", "DemoEpisode", "DemoFileError", "DemoSet", "DemoWriter", "nstep_transitions",
           "open_demos"]
