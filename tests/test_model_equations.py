"""Whole models against direct, slow implementations of their papers' equations: PANM on Dyck
(`CausalPANM`), PANM on SCAN (`TransformerPANM`), the DNC classifier's wiring (`DNCClassifier`), and
geometric attention's initial alpha, beta, gamma (the NDR).

Each slow implementation reads the module's own weights and recomputes its forward pass one sample,
one time step and one slot at a time, in float64; the models run in evaluation mode (no dropout).
The per-equation pieces the models share (PANM's Pointer Units and Mode-2 reads, the DNC memory
step, Transformer layers) are tested on their own in test_formulas.py; here the point is how each
model wires them together, re-derived from the papers rather than from the code."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainables.models.configs import DNCConfig, EncDecPANMConfig, PANMConfig, TransformerConfig
from trainables.models.dnc import EPS as DNC_EPS
from trainables.models.dnc import DNCClassifier
from trainables.models.enc_dec import TransformerPANM
from trainables.models.panm import CausalPANM
from trainables.models.transformer import Attention, UniversalTransformerClassifier


@pytest.fixture()
def float64():
    """The model in float64 too, for comparisons that float32's rounding would blur (sharpened link
    weights raise small numbers to large powers)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def randomise(module: nn.Module, std: float = 0.5, keep: tuple[str, ...] = ()) -> None:
    """Biases start at zero: make every term matter."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not any(name.endswith(k) for k in keep):
                p.normal_(std=std)


# ---------- small pieces, written out from their definitions (float64, one vector at a time) ----------


def w(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double()


def affine(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = w(layer.weight) @ x
    return out + w(layer.bias) if layer.bias is not None else out


def mlp(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """PANM's g^a, g^c, g^o: one hidden ReLU layer."""
    return affine(net[2], torch.relu(affine(net[0], x)))


def gru(cell: nn.GRUCell, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Cho et al. (2014): reset r, update z, candidate n (torch's weight layout r | z | n)."""
    H = len(h)
    gi = w(cell.weight_ih) @ x + w(cell.bias_ih)
    gh = w(cell.weight_hh) @ h + w(cell.bias_hh)
    r = torch.sigmoid(gi[:H] + gh[:H])
    z = torch.sigmoid(gi[H : 2 * H] + gh[H : 2 * H])
    n = torch.tanh(gi[2 * H :] + r * gh[2 * H :])
    return (1 - z) * n + z * h


def lstm(
    cell: nn.LSTMCell, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hochreiter & Schmidhuber with a forget gate: gates i, f, g, o (torch's layout)."""
    H = len(h)
    pre = w(cell.weight_ih) @ x + w(cell.bias_ih) + w(cell.weight_hh) @ h + w(cell.bias_hh)
    i, f, g, o = (
        torch.sigmoid(pre[:H]),
        torch.sigmoid(pre[H : 2 * H]),
        torch.tanh(pre[2 * H : 3 * H]),
        torch.sigmoid(pre[3 * H :]),
    )
    c = f * c + i * g
    return o * torch.tanh(c), c


def stack_rnn(
    cell, x: torch.Tensor, h: torch.Tensor, stack: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Suzgun et al. (2019), the softmax-gated stack RNN: the top of the stack joins the state, an
    Elman step, then push (a new element on top, the rest one down) and pop (the rest one up) mixed
    by a softmax over the two actions, cell by cell."""
    h_tilde = h + affine(cell.read, stack[0])
    h = torch.tanh(
        w(cell.rnn.weight_ih) @ x
        + w(cell.rnn.bias_ih)
        + w(cell.rnn.weight_hh) @ h_tilde
        + w(cell.rnn.bias_hh)
    )
    push, pop = torch.softmax(affine(cell.actions, h), 0)
    element = torch.sigmoid(affine(cell.element, h))
    below = lambda i: stack[i + 1] if i + 1 < len(stack) else torch.zeros_like(stack[0])  # noqa: E731
    above = lambda i: element if i == 0 else stack[i - 1]  # noqa: E731
    return h, [push * above(i) + pop * below(i) for i in range(len(stack))]


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b) / max(float(a.norm()), 1e-12) / max(float(b.norm()), 1e-12)


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    e = [math.exp(s - top) for s in scores]
    return [v / sum(e) for v in e]


def address(n: int, bits: int) -> torch.Tensor:
    """PANM Sec. 2.2: slot n's physical address, n (base 0 at evaluation) in b bits, most significant
    first."""
    return torch.tensor([float((n >> (bits - 1 - k)) & 1) for k in range(bits)], dtype=torch.float64)


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    mean, var = x.mean(), ((x - x.mean()) ** 2).mean()
    return (x - mean) / math.sqrt(float(var) + norm.eps) * w(norm.weight) + w(norm.bias)


# ---------- PANM, one decoding step (Le et al., Sec. 2.2-2.3, Eq. 1-7) ----------


class SlowPANM:
    """PANM's decoding state for one sample, stepped by `step`. `visible` slots of `memory` (a list of
    float64 vectors) may be read at each step: all of them for an encoded input, those up to the
    current symbol on Dyck. Mode-1 pointers start at `first_pointers` (slot indices)."""

    def __init__(self, model, memory: list[torch.Tensor], first_pointers: list[int], start: torch.Tensor):
        cfg = model.cfg
        self.model, self.memory = model, memory
        self.A = [address(n, cfg.address_bits) for n in range(len(memory))]
        self.keys = [[mlp(g, a) for a in self.A] for g in model.address_keys]  # g^a(A[n]), Eq. 2
        self.pointers = [self.A[n] for n in first_pointers]
        self.unit_states = [
            torch.zeros(unit.hidden_size, dtype=torch.float64) for unit in model.pointer_units
        ]
        # Eq. 7: h^c_0 is the memory's sum, mapped to the Controller's size where they differ (our addition).
        h0 = (
            start
            if isinstance(model.controller_start, nn.Identity)
            else affine(model.controller_start, start)
        )
        if cfg.controller == "gru":
            self.control = h0
        elif cfg.controller == "lstm":
            self.control = (h0, torch.zeros_like(h0))  # an LSTM's cell starts empty
        else:
            self.control = (
                h0,
                [torch.zeros(cfg.stack_dim, dtype=torch.float64) for _ in range(cfg.stack_size)],
            )  # an empty stack
        self.sharp_a, self.sharp_c = (math.exp(v) for v in model.log_sharpness.tolist())

    def h_c(self) -> torch.Tensor:
        return self.control if self.model.cfg.controller == "gru" else self.control[0]

    def read(self, weights: list[float], vectors: list[torch.Tensor]) -> torch.Tensor:
        return sum(weights[n] * vectors[n] for n in range(len(weights)))

    def step(self, visible: int, z: torch.Tensor | None) -> torch.Tensor:
        model, M = self.model, self.memory[:visible]
        mode1 = []
        for h, unit in enumerate(model.pointer_units):
            # Eq. 1: the Pointer Unit reads its previous pointer, a soft address.
            self.unit_states[h] = gru(unit, self.pointers[h], self.unit_states[h])
            # Eq. 2: attention over the visible slots' addresses by cosine (with a learned inverse
            # temperature).
            weights = softmax(
                [self.sharp_a * cos(self.unit_states[h], self.keys[h][n]) for n in range(visible)]
            )
            self.pointers[h] = self.read(weights, self.A)  # Eq. 3: p_t = A w_t
            mode1.append(self.read(weights, M))  # Mode-1 dereference *p_t = M w_t
        # Eq. 4: the Mode-2 query from the Mode-1 values; with no Mode-1 head, from h^c_{t-1} (App. D.5).
        source = torch.cat(mode1) if mode1 else self.h_c()
        mode2 = []
        for g in model.mode2_queries:
            q = mlp(g, source)
            mode2.append(
                self.read(softmax([self.sharp_c * cos(q, M[n]) for n in range(visible)]), M)
            )  # Eq. 5-6
        values = mode1 + mode2
        # Eq. 7: [*p^a ..., *p^c ..., z_t]; the authors' code leaves the Mode-2 values to g^o alone.
        read = values if model.cfg.controller_reads_mode2 else mode1
        x = torch.cat(read + ([z] if z is not None else []))
        kind = model.cfg.controller
        if kind == "gru":
            self.control = gru(model.controller, x, self.control)
        elif kind == "lstm":
            self.control = lstm(model.controller, x, *self.control)
        else:
            self.control = stack_rnn(model.controller, x, *self.control)
        return mlp(model.output, torch.cat(values + [self.h_c()]))  # y_t = g^o([*p^a ..., *p^c ..., h^c_t])


# ---------- 1. PANM on Dyck (Sec. 3.2, App. D.2) ----------


def slow_causal_panm(model: CausalPANM, tokens: torch.Tensor) -> torch.Tensor:
    """One sample. Dyck has no encoder: the memory holds the raw symbols, one-hot, one slot per
    symbol; the answer after symbol t may read slots 0..t only (the memory is written as the string
    is read), so at t = 0 every pointer starts at slot 0, the one slot there is (base and end alike),
    and h^c_0 is the sum of the memory then, the first symbol (Eq. 7). z_t is the current symbol."""
    V = model.vocab_size
    memory = [torch.nn.functional.one_hot(tok, V).double() for tok in tokens]
    panm = SlowPANM(model, memory, [0] * model.cfg.mode1_heads, start=memory[0])
    return torch.stack([panm.step(visible=t + 1, z=memory[t]) for t in range(len(tokens))])


@pytest.mark.parametrize(
    "controller,mode1,mode2,reads_mode2",
    [
        ("srnn", 2, 1, True),
        ("lstm", 2, 1, True),
        ("gru", 3, 2, True),
        ("srnn", 0, 1, True),
        ("gru", 2, 1, False),
    ],
)
@torch.no_grad()
def test_causal_panm_on_dyck_against_its_equations(controller, mode1, mode2, reads_mode2):
    torch.manual_seed(11)
    cfg = PANMConfig(
        hidden=6,
        pointer_hidden=7,
        mlp_hidden=5,
        address_bits=4,
        mode1_heads=mode1,
        mode2_heads=mode2,
        sharpness=3.0,
        controller=controller,
        stack_size=4,
        stack_dim=3,
        dropout=0.0,
        controller_reads_mode2=reads_mode2,
    )
    model = CausalPANM(cfg, vocab_size=5, n_outputs=4).eval()
    randomise(model, keep=("log_sharpness",))
    tokens, lengths = torch.randint(0, 5, (2, 6)), torch.tensor([6, 4])
    out = model(tokens, lengths)
    assert out.shape == (2, 6, 4)
    for b in range(2):
        torch.testing.assert_close(out[b].double(), slow_causal_panm(model, tokens[b]), rtol=1e-4, atol=1e-5)


# ---------- 2. PANM on SCAN with a Transformer (App. D.3) ----------


def sinusoid(n: int, d: int) -> torch.Tensor:
    """Vaswani et al.: PE(n, 2i) = sin(n / 10000^(2i/d)), PE(n, 2i+1) = cos(n / 10000^(2i/d))."""
    return torch.tensor(
        [(math.sin if k % 2 == 0 else math.cos)(n / 10000 ** ((k - k % 2) / d)) for k in range(d)],
        dtype=torch.float64,
    )


def attention(
    att: Attention, targets: list[torch.Tensor], sources: list[torch.Tensor], causal: bool
) -> list[torch.Tensor]:
    """Vaswani et al.'s multi-head attention, position by position: per head softmax_j(q_i . k_j /
    sqrt(d_head)) over the sources (up to i where causal), values mixed, heads concatenated, W_o."""
    H, dh = att.n_heads, att.d_head
    out = []
    for i, x in enumerate(targets):
        q = affine(att.query, x)
        keys = [affine(att.key, s) for s in sources]
        values = [affine(att.value, s) for s in sources]
        seen = range(i + 1) if causal else range(len(sources))
        heads = []
        for hd in range(H):
            part = slice(hd * dh, (hd + 1) * dh)
            a = softmax([float(q[part] @ keys[j][part]) / math.sqrt(dh) for j in seen])
            heads.append(sum(a[k] * values[j][part] for k, j in enumerate(seen)))
        out.append(affine(att.out, torch.cat(heads)))
    return out


def feed_forward(ff, x: torch.Tensor) -> torch.Tensor:
    return affine(ff[3], torch.relu(affine(ff[0], x)))


def slow_encoder(model: TransformerPANM, tokens: list[int]) -> list[torch.Tensor]:
    """Post-norm encoder layers over <bos> and the input: a = LN(x + Att(x)), LN(a + FF(a))."""
    d = model.cfg.d_model
    h = [w(model.input_embedding.weight[t]) + sinusoid(n, d) for n, t in enumerate([model.bos_id] + tokens)]
    for layer in model.encoder:
        attended = attention(layer.attention, h, h, causal=False)
        a = [layer_norm(layer.norm_attention, x + y) for x, y in zip(h, attended)]
        h = [layer_norm(layer.norm_ff, x + feed_forward(layer.ff, x)) for x in a]
    return h


def slow_decoder(
    model: TransformerPANM, previous: list[int], memory: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The decoder_layers - 1 Transformer decoder layers (App. D.3: PANM's Controller takes the last
    one's place): causal self-attention, attention over the encoder's output, feed-forward, each
    added and normalised."""
    d = model.cfg.d_model
    h = [w(model.output_embedding.weight[t]) + sinusoid(n, d) for n, t in enumerate(previous)]
    for layer in model.decoder:
        h = [
            layer_norm(layer.norms[0], x + y)
            for x, y in zip(h, attention(layer.self_attention, h, h, causal=True))
        ]
        h = [
            layer_norm(layer.norms[1], x + y)
            for x, y in zip(h, attention(layer.cross_attention, h, memory, causal=False))
        ]
        h = [layer_norm(layer.norms[2], x + feed_forward(layer.ff, x)) for x in h]
    return h


def slow_transformer_panm(
    model: TransformerPANM, tokens: list[int], n_steps: int, targets: list[int] | None
) -> torch.Tensor:
    """One sample. The encoder's output (its <bos> column included: the encoder reads <bos> first)
    is PANM's memory, so the Mode-1 pointers start at its first slot (<bos>) and last slot (the last
    input token) and h^c_0 is the sum of all its slots (Eq. 7); at step t the Controller's input z_t
    is the Transformer decoder's output at position t, z_t = Decoder(y_<t) (App. D.3), over the
    targets (teacher forcing) or its own greedy choices; y_t = g^o([*p ..., h^c_t])."""
    memory = slow_encoder(model, tokens)
    L, heads = len(memory), model.pointer_decoder.cfg.mode1_heads
    panm = SlowPANM(model.pointer_decoder, memory, [0, L - 1, (L - 1) // 2][:heads], start=sum(memory))
    previous, out = [model.bos_id], []
    for t in range(n_steps):
        z = slow_decoder(model, previous, memory)[t]
        out.append(panm.step(visible=L, z=z))
        previous.append(targets[t] if targets is not None else int(out[-1].argmax()))
    return torch.stack(out)


@pytest.mark.parametrize("teacher_forcing,reads_mode2", [(True, True), (False, True), (True, False)])
@torch.no_grad()
def test_transformer_panm_on_scan_against_its_equations(teacher_forcing, reads_mode2):
    torch.manual_seed(12)
    cfg = EncDecPANMConfig(
        d_model=8,
        n_heads=2,
        ff_multiplier=2,
        encoder_layers=2,
        decoder_layers=3,
        dropout=0.0,
        hidden=6,
        mlp_hidden=5,
        address_bits=4,
        mode1_heads=2,
        mode2_heads=1,
        sharpness=3.0,
        controller_reads_mode2=reads_mode2,
    )
    model = TransformerPANM(cfg, vocab_size=9, bos_id=1).eval()
    randomise(model, keep=("log_sharpness",))
    assert len(model.decoder) == 2  # the Controller replaces the third decoder layer
    tokens, lengths = torch.randint(2, 9, (2, 5)), torch.tensor([5, 3])
    tokens[1, 3:] = 0  # padding
    targets = torch.randint(2, 9, (2, 4))
    out = model(tokens, lengths, 4, targets=targets if teacher_forcing else None)
    assert out.shape == (2, 4, 9)
    for b in range(2):
        expected = slow_transformer_panm(
            model, tokens[b, : lengths[b]].tolist(), 4, targets[b].tolist() if teacher_forcing else None
        )
        torch.testing.assert_close(out[b].double(), expected, rtol=1e-5, atol=1e-6)


# ---------- 3. The DNC classifier (Graves et al. 2016, Methods; Csordás & Schmidhuber 2019) ----------


def slow_dnc_memory(cfg: DNCConfig, state: dict, xi: dict) -> dict:
    """One memory step of one sample, cell by cell (Graves et al., Methods, 'Memory addressing'),
    with Csordás & Schmidhuber's deallocation, link sharpness and masks as configured."""
    M, N, R = state["memory"], cfg.n_cells, cfg.n_read_heads

    def content(memory, key, strength, mask):
        # C(M, k, beta)[i] = softmax_i(beta cos(M[i], k)), masked: cos(M[i] * m, k * m)
        m = mask if mask is not None else torch.ones_like(key)
        sims = [
            float((memory[i] * m) @ (key * m))
            / (float((memory[i] * m).norm()) * float((key * m).norm()) + DNC_EPS)
            for i in range(N)
        ]
        return softmax([strength * s for s in sims])

    # Retention psi_i = prod_r (1 - f_r w^r_{t-1}[i]); usage u = (u + w^w - u * w^w) psi.
    psi = [
        math.prod(1 - xi["free_gates"][r] * float(state["read_weights"][r][i]) for r in range(R))
        for i in range(N)
    ]
    u_prev, ww_prev = state["usage"], state["write_weights"]
    usage = [(u_prev[i] + ww_prev[i] - u_prev[i] * ww_prev[i]) * psi[i] for i in range(N)]
    # Allocation over the free list phi (cells by ascending usage):
    # a[phi_j] = (1 - u[phi_j]) prod_{k<j} u[phi_k].
    u = [x * (1 - DNC_EPS) + DNC_EPS for x in usage]
    phi = sorted(range(N), key=lambda i: u[i])
    alloc = [0.0] * N
    for j, cell in enumerate(phi):
        alloc[cell] = (1 - u[cell]) * math.prod(u[phi[k]] for k in range(j))
    c_w = content(M, xi["write_key"], xi["write_strength"], xi.get("write_mask"))
    g_a, g_w = xi["allocation_gate"], xi["write_gate"]
    ww = [g_w * (g_a * alloc[i] + (1 - g_a) * c_w[i]) for i in range(N)]
    # Write: M[i] <- M[i] * (1 - w^w[i] e) + w^w[i] v (times psi_i where freed cells are erased).
    memory = [
        M[i] * (1 - ww[i] * xi["erase"]) * (psi[i] if cfg.deallocate else 1.0) + ww[i] * xi["write"]
        for i in range(N)
    ]
    # Temporal links and precedence.
    p_prev, L_prev = state["precedence"], state["links"]
    links = [
        [0.0 if i == j else (1 - ww[i] - ww[j]) * L_prev[i][j] + ww[i] * p_prev[j] for j in range(N)]
        for i in range(N)
    ]
    precedence = [(1 - sum(ww)) * p_prev[i] + ww[i] for i in range(N)]

    def sharpen(d, s):  # (d / max d)^s, renormalised
        d = [x + DNC_EPS for x in d]
        d = [(x / max(d)) ** s for x in d]
        return [x / max(sum(d), DNC_EPS) for x in d]

    read_weights, reads = [], []
    for r in range(R):
        prev = state["read_weights"][r]
        f = [sum(links[i][j] * prev[j] for j in range(N)) for i in range(N)]  # f = L w^r_{t-1}
        b = [sum(links[j][i] * prev[j] for j in range(N)) for i in range(N)]  # b = L^T w^r_{t-1}
        if cfg.sharpen_links:
            f, b = sharpen(f, xi["sharpness"][0][r]), sharpen(b, xi["sharpness"][1][r])
        c = content(
            memory,
            xi["read_keys"][r],
            xi["read_strengths"][r],
            xi["read_masks"][r] if "read_masks" in xi else None,
        )
        pi = xi["read_modes"][r]  # (backward, content, forward)
        weights = [pi[0] * b[i] + pi[1] * c[i] + pi[2] * f[i] for i in range(N)]
        read_weights.append(weights)
        reads.append(sum(weights[i] * memory[i] for i in range(N)))
    return {
        "memory": memory,
        "usage": usage,
        "precedence": precedence,
        "links": links,
        "write_weights": ww,
        "read_weights": read_weights,
        "reads": reads,
    }


def slow_interface(cfg: DNCConfig, vector: torch.Tensor) -> dict:
    """Graves et al., 'Interface parameters': the vector read in order [k_r, beta_r, k_w, beta_w, e, v,
    f, g_a, g_w, pi], then the link sharpness and masks; strengths oneplus, gates sigmoid, modes softmax."""
    R, W = cfg.n_read_heads, cfg.word_size or cfg.d_model
    values = iter(vector.tolist())
    take = lambda n: [next(values) for _ in range(n)]  # noqa: E731
    vec = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    oneplus = lambda x: 1 + math.log1p(math.exp(x))  # noqa: E731
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    xi = {
        "read_keys": [vec(take(W)) for _ in range(R)],
        "read_strengths": [oneplus(x) for x in take(R)],
        "write_key": vec(take(W)),
        "write_strength": oneplus(take(1)[0]),
        "erase": vec([sigmoid(x) for x in take(W)]),
        "write": vec(take(W)),
        "free_gates": [sigmoid(x) for x in take(R)],
        "allocation_gate": sigmoid(take(1)[0]),
        "write_gate": sigmoid(take(1)[0]),
        "read_modes": [softmax(take(3)) for _ in range(R)],
    }
    if cfg.sharpen_links:
        xi["sharpness"] = [[oneplus(x) for x in take(R)] for _ in range(2)]  # forward, backward
    if cfg.masked_addressing:
        xi["read_masks"] = [vec([sigmoid(x) for x in take(W)]) for _ in range(R)]
        xi["write_mask"] = vec([sigmoid(x) for x in take(W)])
    assert next(values, None) is None
    return xi


def slow_dnc_classifier(model: DNCClassifier, tokens: list[int]) -> tuple[torch.Tensor, int]:
    """One sample. Graves et al., Methods, 'Controller network': the LSTM reads x_t with the previous
    step's read vectors, chi_t = [x_t; r^1_{t-1} ... r^R_{t-1}]; its state gives the interface vector
    xi_t = W_xi h_t (clipped to +-20, as the NDR authors' DNC); the memory steps; the output is
    y_t = W_y h_t + W_r [r^1_t ... r^R_t] with the new reads. The class comes from the output at the
    last real token. -> (logits, how many interface values were clipped)."""
    cfg = model.cfg
    N, R, W, H = cfg.n_cells, cfg.n_read_heads, model.memory.words, cfg.d_model
    zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
    state = {
        "memory": [zeros(W) for _ in range(N)],
        "usage": [0.0] * N,
        "precedence": [0.0] * N,
        "links": [[0.0] * N for _ in range(N)],
        "read_weights": [[0.0] * N for _ in range(R)],
        "write_weights": [0.0] * N,
        "reads": [zeros(W) for _ in range(R)],
    }
    h, c = zeros(H), zeros(H)
    clipped = 0
    for token in tokens:
        x = w(model.embedding.weight[token])
        h, c = lstm(model.controller, torch.cat([x] + state["reads"]), h, c)
        raw = affine(model.to_interface, h)
        clipped += int((raw.abs() > cfg.clip_controls).sum())
        state = slow_dnc_memory(
            cfg, state, slow_interface(cfg, raw.clamp(-cfg.clip_controls, cfg.clip_controls))
        )
        y = affine(model.controller_out, h) + affine(model.reads_out, torch.cat(state["reads"]))
    return affine(model.readout, y), clipped


@pytest.mark.parametrize(
    "options", [{}, {"deallocate": False, "sharpen_links": False, "masked_addressing": True, "word_size": 3}]
)
@torch.no_grad()
def test_dnc_classifier_wiring_against_its_equations(options, float64):
    torch.manual_seed(13)
    cfg = DNCConfig(d_model=6, n_cells=4, n_read_heads=2, embedding_size=5, dropout=0.0, **options)
    model = DNCClassifier(cfg, vocab_size=7, n_classes=3, pad_id=0).eval()
    randomise(model)
    model.to_interface.weight.mul_(
        100
    )  # interface values beyond the +-20 clip, keys and write vectors among them
    tokens, lengths = torch.randint(1, 7, (2, 5)), torch.tensor([5, 3])
    tokens[1, 3:] = 0
    out = model(tokens, lengths)
    assert out.shape == (2, 3)
    clipped = 0
    for b in range(2):
        expected, n = slow_dnc_classifier(model, tokens[b, : lengths[b]].tolist())
        clipped += n
        torch.testing.assert_close(out[b], expected)
    assert clipped > 0  # the clip was exercised


# ---------- 4. Geometric attention's initial alpha, beta, gamma (NDR, Sec. 2.2) ----------


@pytest.mark.parametrize("shared", [True, False])
def test_geometric_attention_starts_at_the_papers_alpha_beta_gamma(shared):
    """Eq. 10, P_ij = sigmoid(alpha q_i^T k_j + beta D_ij + gamma), starts as scaled dot-product
    attention plus the direction term: alpha = 1 / sqrt(d_head), beta = 1, gamma = 0 (the paper; the
    authors' `scale`, `scale_pos`, `s_bias`); one of each shared by the heads, or one per head."""
    att = Attention(
        "geometric", 12, 3, attention_dropout=0.0, query_dropout=0.0, shared_geometric_scale=shared
    )
    n = 1 if shared else 3
    assert att.alpha.tolist() == pytest.approx([1 / math.sqrt(4)] * n)
    assert att.beta.tolist() == [1.0] * n
    assert att.gamma.tolist() == [0.0] * n
    # And in the NDR as built, at the paper's size (d = 256, 4 heads): nothing re-initialises them.
    ndr = UniversalTransformerClassifier(
        TransformerConfig(shared_geometric_scale=shared),
        "geometric",
        True,
        vocab_size=10,
        n_classes=3,
        pad_id=0,
        bos_id=1,
        eos_id=2,
    )
    n = 1 if shared else 4
    assert ndr.layer.attention.alpha.tolist() == pytest.approx([1 / 8] * n)
    assert ndr.layer.attention.beta.tolist() == [1.0] * n
    assert ndr.layer.attention.gamma.tolist() == [0.0] * n
