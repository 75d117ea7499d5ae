"""The one error the test harnesses raise: a run or cluster that did not come up, died, or timed out."""


class HarnessError(RuntimeError):
    """A harnessed run or cluster failed; the message names what and ends with the log's tail."""
