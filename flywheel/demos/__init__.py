"""Demonstrations: the versioned file format replay and the learner's pretraining load demonstrations from."""

from .format import (
    FORMAT,
    VERSION,
    DemoFileError,
    DemoFrames,
    DemoSet,
    DemoWriter,
    nstep_transitions,
    open_demos,
)

__all__ = ["FORMAT", "VERSION", "DemoFileError", "DemoFrames", "DemoSet", "DemoWriter",
           "nstep_transitions", "open_demos"]
