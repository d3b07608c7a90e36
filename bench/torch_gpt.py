"""bench/torch_gpt.py — the PyTorch peer's GPT for loom's GPT benchmarks: GPT-2's architecture
(Hugging Face's GPT2LMHeadModel: pre-LayerNorm blocks with eps 1e-5, learned positions, GELU
with the tanh approximation, a 4x MLP, the head tied to the token embedding, N(0, 0.02) init with
the residual projections at 0.02/sqrt(2 n_layer)) written as lean as nanoGPT's model.py, with
F.scaled_dot_product_attention. Also the fortunes corpus as data/text.cpp reads it, and
nanoGPT's optimizer setup and learning-rate schedule.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout, bias):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5, bias=bias)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5, bias=bias)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        x = x + self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.drop(self.mlp_proj(h))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_embd, n_layer, n_head, dropout=0.0, bias=True):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(model, lr, betas, weight_decay, fused=False):
    """nanoGPT's: AdamW, weight decay on the parameters of two or more dims (matrices and
    embeddings), none on biases and LayerNorm weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **kwargs)


def learning_rate(it, lr, min_lr, warmup, decay_iters):
    """Linear warm-up over `warmup` steps, then a cosine from lr to min_lr at decay_iters
    (nanoGPT's get_lr)."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def read_corpus(path):
    """data/text.cpp's read_corpus: a file, or every regular file below a folder in sorted path
    order except fortune's .dat indexes and .u8 links (symlinks are skipped)."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return f.read()
    files = []
    for root, dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            if os.path.islink(full) or name.endswith(".dat") or name.endswith(".u8"):
                continue
            if os.path.isfile(full):
                files.append(full)
    out = b""
    for full in sorted(files):
        with open(full, "rb") as f:
            out += f.read()
    return out
