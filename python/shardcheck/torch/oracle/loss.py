"""The loss (reference/README.md "Loss"): per-token cross entropy under the loss mask, the global
loss kept as numerators and denominators (LossParts) so that microbatches and ranks add up, and
objective(), what a microbatch calls backward() on with the global batch's weights."""

import dataclasses

import torch

@dataclasses.dataclass
class LossParts:
    """Numerators and denominators of the global loss, kept apart: loss_sum (Σ masked token
    losses, a float64 tensor), tokens (Σ loss_mask), aux_sum (Σ over sequences of their MoE aux,
    float64 tensor), sequences. Add parts of microbatches / ranks with +; loss() is the rule."""

    loss_sum: torch.Tensor
    tokens: int
    aux_sum: torch.Tensor
    sequences: int

    def __add__(self, other):
        return LossParts(self.loss_sum + other.loss_sum, self.tokens + other.tokens,
                         self.aux_sum + other.aux_sum, self.sequences + other.sequences)

    def loss(self):
        """Σ loss_t / Σ mask + Σ aux / #sequences, as a float (never a mean of means)."""
        main = float(self.loss_sum.detach()) / self.tokens if self.tokens > 0 else 0.0
        aux = float(self.aux_sum.detach()) / self.sequences if self.sequences > 0 else 0.0
        return main + aux


def token_losses(logits, targets, loss_mask):
    """logsumexp(logits[t]) − logits[t, target[t]] where loss_mask[t] = 1, else 0 (in the
    logits' dtype)."""
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.where(loss_mask != 0, lse - picked, torch.zeros_like(lse))


def loss_parts(logits, targets, loss_mask, aux=None, sequences=None):
    """LossParts of a microbatch (or a rank's share): token losses computed in the logits' dtype,
    summed in float64 (as the reference, which widens each token's loss to double)."""
    loss_sum = token_losses(logits, targets, loss_mask).to(torch.float64).sum()
    if aux is None:
        aux = torch.zeros((), dtype=torch.float64, device=logits.device)
    return LossParts(loss_sum, int((loss_mask != 0).sum()), aux.to(torch.float64),
                     int(logits.shape[0]) if sequences is None else int(sequences))


def objective(parts, token_weight, sequence_weight):
    """What to call backward() on: loss_sum · token_weight + aux_sum · sequence_weight with the
    GLOBAL batch's weights (token_weights(global batch)). Gradients of all microbatches and ranks
    then add up to the global loss's gradient. A DDP/FSDP rank multiplies it by the data-parallel
    world size (their reductions average over ranks)."""
    return parts.loss_sum * token_weight + parts.aux_sum * sequence_weight


def global_loss(parts_list):
    """The global-batch loss from the parts of all microbatches / ranks."""
    total = parts_list[0]
    for p in parts_list[1:]:
        total = total + p
    return total.loss()
