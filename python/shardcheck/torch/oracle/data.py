"""Synthetic data and the sampler (reference/README.md "Synthetic data", "Packing", "Sampler"):
the corpus, packing into samples, the epoch permutation, Batch (a step's sequences with their
global indices) and Dataset, and the global batch's loss weights (token_weights)."""

import functools

import numpy as np
import torch

from .rng import _SHIFT32, RngStream

def make_documents(data, vocab, seed):
    """The corpus: a list of int64 arrays, document d = make_document(data, vocab, seed, d)."""
    n, lmax = int(data.documents), int(data.max_len)
    length = RngStream(seed, "data/length")
    stride = RngStream(seed, "data/stride")
    token, noise = RngStream(seed, "data/token"), RngStream(seed, "data/noise")
    docs = []
    chunk = max(1, (1 << 20) // lmax)
    for first in range(0, n, chunk):
        d = np.arange(first, min(n, first + chunk), dtype=np.uint64)
        lens = data.min_len + length.below(d, data.max_len - data.min_len + 1).astype(np.int64)
        strides = 1 + stride.below(d, 3).astype(np.int64)
        idx = (d[:, None] << _SHIFT32) | np.arange(lmax, dtype=np.uint64)[None, :]
        draws = 1 + token.below(idx, vocab - 1).astype(np.int64)
        noisy = noise.uniform(idx) < 0.1
        out = np.empty((len(d), lmax), dtype=np.int64)
        out[:, 0] = draws[:, 0]
        for t in range(1, lmax):
            out[:, t] = np.where(noisy[:, t], draws[:, t],
                                 1 + (out[:, t - 1] - 1 + strides) % (vocab - 1))
        docs.extend(out[r, :lens[r]] for r in range(len(d)))
    return docs


FIELDS = ("tokens", "targets", "loss_mask", "doc_ids", "positions")


def pack_documents(docs, seq_len, packing):
    """The dataset's samples: {field: int64 array [N, seq_len]} (README "Packing")."""
    streams = []
    for d, doc in enumerate(docs):
        n = len(doc)
        target = np.zeros(n, dtype=np.int64)
        target[:-1] = doc[1:]
        mask = np.ones(n, dtype=np.int64)
        mask[-1] = 0
        streams.append((doc, target, mask, np.full(n, d, dtype=np.int64),
                        np.arange(n, dtype=np.int64)))
    pad = (0, 0, 0, -1, 0)
    if packing:
        cols = [np.concatenate([s[f] for s in streams]) if streams else np.zeros(0, np.int64)
                for f in range(5)]
        total = len(cols[0])
        n = -(-total // seq_len)
        out = {}
        for f, name in enumerate(FIELDS):
            a = np.full(n * seq_len, pad[f], dtype=np.int64)
            a[:total] = cols[f]
            out[name] = a.reshape(n, seq_len)
        return out
    out = {name: np.full((len(streams), seq_len), pad[f], dtype=np.int64)
           for f, name in enumerate(FIELDS)}
    for i, s in enumerate(streams):
        k = min(seq_len, len(s[0]))
        for f, name in enumerate(FIELDS):
            out[name][i, :k] = s[f][:k]
    return out


def permutation(seed, epoch, n):
    """The sampler's epoch permutation of [0, n): Fisher-Yates with j = below(i, i + 1) drawn
    from "sampler/shuffle" at step = epoch."""
    p = np.arange(n, dtype=np.int64)
    if n < 2:
        return p
    i = np.arange(n - 1, 0, -1, dtype=np.uint64)
    js = RngStream(seed, "sampler/shuffle", epoch).below(i, i + np.uint64(1)).astype(np.int64)
    pl = p.tolist()
    for ii, j in zip(range(n - 1, 0, -1), js.tolist()):
        pl[ii], pl[j] = pl[j], pl[ii]
    return np.array(pl, dtype=np.int64)


class Batch:
    """Sequences of one step as int64 tensors [B, S] (tokens, targets, loss_mask, doc_ids,
    positions) and `index` [B], each sequence's position in the step's global batch (it keys
    dropout; slicing keeps it)."""

    def __init__(self, tokens, targets, loss_mask, doc_ids, positions, index):
        self.tokens, self.targets, self.loss_mask = tokens, targets, loss_mask
        self.doc_ids, self.positions, self.index = doc_ids, positions, index

    def __len__(self):
        return int(self.tokens.shape[0])

    def __getitem__(self, rows):
        if isinstance(rows, int):
            rows = slice(rows, rows + 1)
        return Batch(*(getattr(self, f)[rows] for f in FIELDS + ("index",)))

    def microbatches(self, size):
        """Consecutive slices of `size` sequences, in order."""
        if len(self) % size:
            raise ValueError(f"micro batch {size} does not divide {len(self)} sequences")
        return [self[k:k + size] for k in range(0, len(self), size)]

    def rank_slice(self, rank, world):
        """DP rank `rank` of `world`: the contiguous slice [r*B/D, (r+1)*B/D)."""
        if len(self) % world:
            raise ValueError(f"{len(self)} sequences do not divide over {world} ranks")
        per = len(self) // world
        return self[rank * per:(rank + 1) * per]

    def to(self, device):
        return Batch(*(getattr(self, f).to(device) for f in FIELDS + ("index",)))


class Dataset:
    """The scenario's samples and its DistributedSampler, replayed from step 1."""

    def __init__(self, data, vocab, seq_len, seed, global_batch):
        self.samples = pack_documents(make_documents(data, vocab, seed), seq_len, data.packing)
        self.n = len(self.samples["tokens"])
        self.seed, self.batch, self.drop_last = seed, global_batch, data.drop_last
        if not 0 < global_batch <= self.n:
            raise ValueError(f"global batch {global_batch} must be in [1, {self.n}] (samples)")
        self._ids = []  # global batch ids of steps 1, 2, ...
        self._epoch, self._offset, self._padded = 0, 0, 0
        self._perm = {}

    def _permutation(self, epoch):
        if epoch not in self._perm:
            self._perm = {epoch: permutation(self.seed, epoch, self.n)}
        return self._perm[epoch]

    def sample_ids(self, step):
        """The sample ids of step `step`'s global batch (1-based)."""
        if step < 1:
            raise ValueError("steps are 1-based")
        while len(self._ids) < step:
            if self._offset >= self.n or (self.drop_last and self._offset + self.batch > self.n):
                self._epoch, self._offset = self._epoch + 1, 0
            perm = self._permutation(self._epoch)
            at = self._offset + np.arange(self.batch)
            self._padded += int((at >= self.n).sum())
            self._ids.append(perm[np.where(at < self.n, at, at - self.n)])
            self._offset += self.batch
        return self._ids[step - 1]

    def gather(self, ids, first_index=0):
        ids = np.asarray(ids, dtype=np.int64)
        fields = [torch.from_numpy(self.samples[f][ids].copy()) for f in FIELDS]
        index = torch.arange(first_index, first_index + len(ids), dtype=torch.int64)
        return Batch(*fields, index)

    def global_batch(self, step):
        return self.gather(self.sample_ids(step))


@functools.lru_cache(maxsize=8)
def _dataset(data, vocab, seq_len, seed, global_batch):
    return Dataset(data, vocab, seq_len, seed, global_batch)


def dataset(cfg):
    """The (cached) Dataset of a Config."""
    return _dataset(cfg.data, cfg.model.vocab, cfg.model.seq_len, cfg.seed, cfg.train.global_batch)


def global_batch(cfg, step):
    """Step `step`'s global batch (1-based): a Batch of cfg.train.global_batch sequences with
    index = 0..B-1."""
    return dataset(cfg).global_batch(step)


def global_counts(batch):
    """(Σ loss_mask, number of sequences) of a global batch: the loss's two denominators."""
    return int(batch.loss_mask.sum()), len(batch)


def token_weights(batch):
    """(token_weight, sequence_weight) = (1 / Σ loss_mask, 1 / #sequences) of the GLOBAL batch:
    the backward weights of each masked token's loss and each sequence's aux loss, so that the
    gradients of every microbatch and rank simply add up to the global loss's."""
    tokens, sequences = global_counts(batch)
    return (1.0 / tokens if tokens > 0 else 0.0), 1.0 / sequences
