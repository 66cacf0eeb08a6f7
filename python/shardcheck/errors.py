"""The simulator's errors as Python exceptions (raised by shardcheck._core and shardcheck.torch).

Every CommError names the rank that saw it, the group, the op and its sequence number in that
group, as comm::CommError does (comm/errors.hpp); the subclasses add who is to blame."""


class CommError(RuntimeError):
    """A collective or point-to-point op failed on this rank."""

    def __init__(self, message, rank=-1, group="", op="", seq=0):
        super().__init__(message)
        self.rank, self.group, self.op, self.seq = rank, group, op, seq


class InvalidArgument(CommError):
    """The call can never work (buffer size, dtype, root or peer out of range)."""


class MismatchError(CommError):
    """Members of a group issued different ops at one sequence number; `ranks`: the two world
    ranks that disagree."""

    def __init__(self, message, rank, group, op, seq, ranks):
        super().__init__(message, rank, group, op, seq)
        self.ranks = list(ranks)


class PeerError(CommError):
    """A peer failed or left: the op can never complete; `peer` is its world rank."""

    def __init__(self, message, rank, group, op, seq, peer):
        super().__init__(message, rank, group, op, seq)
        self.peer = peer


class DeadlockError(CommError):
    """Every live rank is blocked; `missing`: the world ranks that never arrived at this op."""

    def __init__(self, message, rank, group, op, seq, missing):
        super().__init__(message, rank, group, op, seq)
        self.missing = list(missing)


class CorruptionError(CommError):
    """A contribution failed its checksum; `source` is the world rank whose payload changed."""

    def __init__(self, message, rank, group, op, seq, source):
        super().__init__(message, rank, group, op, seq)
        self.source = source


class AbortedError(CommError):
    """The communicator was aborted after a failure elsewhere."""


class InjectedCrash(RuntimeError):
    """A crash fault fired on this rank at (step, op_index)."""

    def __init__(self, message, rank, step, op_index):
        super().__init__(message)
        self.rank, self.step, self.op_index = rank, step, op_index


class ConfigError(ValueError):
    """A world's options (topology, faults, health) are unusable; the message names the JSON path
    and what was expected."""


class RankFailure(RuntimeError):
    """A simulated run failed: `rank` is the rank whose error came first (root causes before the
    failures they caused), `cause` that rank's exception, `diagnosis` the simulator's paragraph
    (who never arrived, who disagreed, what each blocked rank waits in)."""

    def __init__(self, message, rank, cause=None, diagnosis=""):
        text = message if not diagnosis else f"{message}\n{diagnosis}"
        super().__init__(text)
        self.rank, self.cause, self.diagnosis = rank, cause, diagnosis
