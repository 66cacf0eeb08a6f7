"""The check a torch.distributed.checkpoint (DCP) directory lacks, and a team needs before it
resumes: DCP commits a save by writing `.metadata` last (a save whose ranks did not all finish
has none), but it keeps no checksums, so a truncated or altered `.distcp` file, or a `.metadata`
that names a file that is gone, is found late or not at all.

    sct.checkpoint.save(state, ckpt)      # dcp.save, then a seal: every file's size and SHA-256
    sct.checkpoint.verify(ckpt)           # CheckpointError naming the file, or the seal
    sct.checkpoint.load(state, ckpt)      # verify, then dcp.load (which reshards)

save and load are collective (every rank calls them); verify is not (any rank, any process).
verify without a seal still checks what `.metadata` promises: every file it names exists and
holds every byte range it names."""

import hashlib
import json
import os

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

SEAL = ".shardcheck-seal.json"


class CheckpointError(RuntimeError):
    """A checkpoint that must not be loaded; `path` is the file to blame (or the directory)."""

    def __init__(self, message, path):
        super().__init__(message)
        self.path = path


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _data_files(ckpt):
    return sorted(n for n in os.listdir(ckpt) if n != SEAL and not n.startswith(".tmp"))


def seal(ckpt):
    """Records every file of a committed DCP checkpoint (size and SHA-256) in the seal file,
    written atomically. Refuses a directory without `.metadata`."""
    verify(ckpt, sealed=False)
    files = {n: {"bytes": os.path.getsize(os.path.join(ckpt, n)),
                 "sha256": _digest(os.path.join(ckpt, n))} for n in _data_files(ckpt)}
    tmp = os.path.join(ckpt, SEAL + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": "shardcheck-dcp-seal-1", "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt, SEAL))


def verify(ckpt, sealed=True):
    """Raises CheckpointError naming what is wrong: no `.metadata` (never committed), a file that
    `.metadata` names missing or shorter than the byte ranges it names, and with sealed=True a
    missing seal, or a file whose size or SHA-256 differs from the seal's."""
    meta_path = os.path.join(ckpt, ".metadata")
    if not os.path.isdir(ckpt):
        raise CheckpointError(f"{ckpt}: no such checkpoint directory", ckpt)
    if not os.path.exists(meta_path):
        raise CheckpointError(f"{ckpt}: not a committed checkpoint: .metadata is absent (the save "
                              "did not finish on every rank)", ckpt)
    try:
        meta = dcp.FileSystemReader(ckpt).read_metadata()
    except Exception as e:  # an unreadable .metadata: DCP's own error, with the file named
        raise CheckpointError(f"{meta_path}: unreadable DCP metadata ({e})", meta_path) from e
    ends = {}
    for info in (meta.storage_data or {}).values():
        end = info.offset + info.length
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), end)
    for name, end in sorted(ends.items()):
        path = os.path.join(ckpt, name)
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: named by .metadata but missing", path)
        size = os.path.getsize(path)
        if size < end:
            raise CheckpointError(f"{path}: truncated: {size} bytes, .metadata names bytes up to "
                                  f"{end}", path)
    if not sealed:
        return
    seal_path = os.path.join(ckpt, SEAL)
    if not os.path.exists(seal_path):
        raise CheckpointError(f"{ckpt}: no {SEAL}: saved without shardcheck's seal, so altered "
                              "bytes cannot be told (verify(ckpt, sealed=False) checks the rest)",
                              ckpt)
    with open(seal_path) as f:
        files = json.load(f)["files"]
    for name, want in sorted(files.items()):
        path = os.path.join(ckpt, name)
        if not os.path.exists(path):
            raise CheckpointError(f"{path}: sealed but missing", path)
        size = os.path.getsize(path)
        if size != want["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, sealed with {want['bytes']}", path)
        if _digest(path) != want["sha256"]:
            raise CheckpointError(f"{path}: contents differ from the seal (SHA-256)", path)


def save(state, ckpt, **kw):
    """dcp.save on every rank, then rank 0 seals the committed directory (collective)."""
    dcp.save(state, checkpoint_id=ckpt, **kw)
    if dist.get_rank() == 0:
        seal(ckpt)
    dist.barrier()


def load(state, ckpt, **kw):
    """verify, then dcp.load (collective). Every rank verifies, so every rank raises the same
    CheckpointError and none is left waiting in a collective."""
    verify(ckpt)
    dcp.load(state, checkpoint_id=ckpt, **kw)
