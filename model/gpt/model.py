"""GPT-2 in one file, laid out so OpenAI's checkpoints load without renaming.

Parameter names follow the original GPT-2 release (transformer.wte, h.N.attn.c_attn, ...) so the
Hugging Face state dict maps one to one; the only difference is that GPT-2 stores its projections
as Conv1D (in, out) while we use nn.Linear (out, in), which model.checkpointing.hf transposes on load and export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from model.gpt.fused_loss import linear_cross_entropy, plain_cross_entropy
from model.settings.shape_rules import PRESETS, SHAPE_RULES  # noqa: F401 (PRESETS: OpenAI's sizes, imported from here)


@dataclass
class GPTConfig:
    """Shape of a GPT-2 model. The defaults are GPT-2 small (124M)."""

    block_size: int = 1024
    """Longest context the position embedding covers."""
    vocab_size: int = 50257
    """GPT-2 BPE vocabulary (50,000 merges + 256 bytes + <|endoftext|>)."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per block; n_embd must be divisible by it."""
    n_embd: int = 768
    """Width of the residual stream."""
    dropout: float = 0.0
    """Dropout on attention weights, residual branches and embeddings (0 for fine-tuning small data is fine)."""
    bias: bool = True
    """Biases in Linear layers and LayerNorms; GPT-2 checkpoints have them."""

    def __post_init__(self) -> None:
        for rule in SHAPE_RULES:
            value = getattr(self, rule.field)
            if not rule.bound(value):
                raise ValueError(f"GPTConfig.{rule.field} must be {rule.bound_text}, got {value}")
            if not rule.holds(self):
                raise ValueError(f"GPTConfig.{rule.field} ({value}) must be {rule.relation_allows(self)}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        # q, k and v for all heads in one matmul, as GPT-2 stores them.
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Fused kernel: no (T, T) mask buffer in the state dict, and flash-style memory use.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU as GPT-2 was trained with it: the tanh approximation ("gelu_new" in transformers).

    In bf16 the exact (erf) form is used instead. The two differ by at most 4.7e-4, less than bf16's
    rounding step for any output above 1/16 in size, where they round to the same value or a
    neighbour (tests/model/test_model.py). CPU kernels run erf's forward 4.8x and backward 2.5x
    faster than tanh's in bf16: ~4% of a GPT-2-small step (docs/performance.md)."""
    if x.dtype == torch.bfloat16:
        return F.gelu(x)
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.ModuleDict):
    """The stack under GPT-2's own names (transformer.wte, transformer.h.0, ...), its parts typed."""

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Dropout
    h: nn.ModuleList
    ln_f: nn.LayerNorm


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = Transformer(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.fused_loss = True
        """The loss through model.gpt.fused_loss's kernels; False: the logits, then F.cross_entropy."""
        # Tied input and output embeddings, as in GPT-2: one matrix, two uses.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales residual projections by 1/sqrt(2 * n_layer) so the stream's variance
        # does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings are left out by default since they do no matmuls
        (token embeddings stay in: tied, they are the output projection)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6N for the matmuls with weights (forward 2N, backward 4N) plus
        12·L·H·Q·T for attention scores and their weighted sum (PaLM appendix B)."""
        c = self.config
        T = seq_len or c.block_size
        return 6 * self.num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * T

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> final LayerNorm output (B, T, n_embd), the input of lm_head."""
        _, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than the model's block_size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, vocab), None); with targets (B, T), (None, mean loss)
        (positions with target -1 are ignored). With fused_loss (the default) the loss never
        materialises fp32 logits (model.gpt.fused_loss: a CPU kernel, a Triton kernel on CUDA)."""
        hidden = self.hidden_states(idx)
        if targets is None:
            return self.lm_head(hidden), None
        loss = linear_cross_entropy if self.fused_loss else plain_cross_entropy
        return None, loss(hidden, self.lm_head.weight, targets)

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context (e.g. a 1024-token checkpoint fine-tuned on 256-token blocks)."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(
                f"block_size must be in [1, {self.config.block_size}] to crop this model, got {block_size}"
            )
        self.config.block_size = block_size
        # A copy, not a view: a view would keep (and torch.save would write) the full table.
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight.detach()[:block_size].clone())

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 means greedy.

        Contexts longer than block_size keep their last block_size tokens."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            # Only the last position's logits are needed: skips (T-1) x vocab of the largest matmul.
            logits = self.lm_head(self.hidden_states(context)[:, -1, :]).float()
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits[logits < kth] = -float("inf")
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, next_id), dim=1)
        return idx
