"""Transformers-style blocks written in plain torch, so that a task stays self-contained.

Each mirrors a block of a common model family in the `transformers` library (the class it
mirrors is recorded; the crawl notes whether the installed transformers still has it). The
sources are emitted verbatim above `Model`; every block maps (batch, sequence, hidden) to the
same shape.
"""

from __future__ import annotations

RMS_NORM = '''
class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Llama, Qwen2, Mistral)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))
'''

GATED_MLP = '''
class GatedMLP(nn.Module):
    """SwiGLU feed-forward block (Llama, Qwen2, Mistral): down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''

GELU_MLP = '''
class GeluMLP(nn.Module):
    """GPT-2 feed-forward block: c_proj(gelu_tanh(c_fc(x)))."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.c_fc = nn.Linear(hidden_size, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
'''

_ROTARY_HELPERS = '''
def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_cos_sin(seq_len, head_dim, base, device, dtype):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
'''

ROTARY = _ROTARY_HELPERS + '''

class RotaryEmbedding(nn.Module):
    """Rotary position embedding applied per head (Llama's RotaryEmbedding and apply_rotary_pos_emb)."""

    def __init__(self, hidden_size, num_heads=4, base=10000.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.base = base

    def forward(self, x):
        batch, seq_len, hidden = x.shape
        heads = x.view(batch, seq_len, self.num_heads, self.head_dim)
        cos, sin = rotary_cos_sin(seq_len, self.head_dim, self.base, x.device, x.dtype)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        return (heads * cos + rotate_half(heads) * sin).reshape(batch, seq_len, hidden)
'''

CAUSAL_ATTENTION = '''
class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with fused QKV projection (GPT-2's attention)."""

    def __init__(self, hidden_size, num_heads=4):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        batch, seq_len, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, seq_len, hidden)
        return self.out_proj(out)
'''

GQA_ATTENTION = _ROTARY_HELPERS + '''

class GroupedQueryAttention(nn.Module):
    """Causal grouped-query attention with rotary embeddings (Llama / Qwen2 attention)."""

    def __init__(self, hidden_size, num_heads=4, num_kv_heads=2, base=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.base = base
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, x):
        batch, seq_len, hidden = x.shape
        q = self.q_proj(x).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(seq_len, self.head_dim, self.base, x.device, x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        repeat = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, seq_len, hidden)
        return self.o_proj(out)
'''

# name -> (source, class it mirrors in transformers, heads the hidden size is split into, has an intermediate size)
BLOCKS = {
    "RMSNorm": (RMS_NORM, "transformers.models.llama.modeling_llama.LlamaRMSNorm", 1, False),
    "GatedMLP": (GATED_MLP, "transformers.models.llama.modeling_llama.LlamaMLP", 1, True),
    "GeluMLP": (GELU_MLP, "transformers.models.gpt2.modeling_gpt2.GPT2MLP", 1, True),
    "RotaryEmbedding": (ROTARY, "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding", 4, False),
    "CausalSelfAttention": (CAUSAL_ATTENTION, "transformers.models.gpt2.modeling_gpt2.GPT2Attention", 4, False),
    "GroupedQueryAttention": (GQA_ATTENTION, "transformers.models.qwen2.modeling_qwen2.Qwen2Attention", 4, False),
}


def block_source(name: str) -> str:
    return BLOCKS[name][0].strip("\n") + "\n"
