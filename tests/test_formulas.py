"""Every attention/gating formula of the NDR paper against a direct, slow implementation of its equation."""

import math

import pytest
import torch

from trainables.models.dropout import Dropout
from trainables.models.transformer import (
    Attention,
    Layer,
    TransformerConfig,
    geometric_attention_weights,
    geometric_order,
    sinusoids,
)


@pytest.fixture(autouse=True)
def float64():
    """Exact comparisons with the slow implementations, without leaking into other test modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def closer_set(i: int, j: int, n: int) -> list[int]:
    """S_ij as the sentence above Eq. 8 defines it: sources closer to i than j is; at equal distance
    the one to the right of i is the closer."""
    out = []
    for k in range(n):
        if k in (i, j):
            continue
        if abs(i - k) < abs(i - j) or (abs(i - k) == abs(i - j) and k > i):
            out.append(k)
    return out


def eq8_set(i: int, j: int, n: int) -> list[int]:
    """S_ij exactly as Eq. 8 prints it: strict distance for i < j, non-strict for j < i."""
    others = [k for k in range(n) if k not in (i, j)]
    if i < j:
        return [k for k in others if abs(i - k) < abs(i - j)]
    return [k for k in others if abs(i - k) <= abs(i - j)]


def test_eq8_read_literally_agrees_with_the_sentence_above_it():
    n = 7
    assert all(eq8_set(i, j, n) == closer_set(i, j, n) for i in range(n) for j in range(n) if i != j)


def slow_geometric(logits: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(logits)
    n = logits.shape[-1]
    rows = []
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append(torch.zeros_like(p[..., 0, 0]))
                continue
            a = p[..., i, j]
            for k in closer_set(i, j, n):
                a = a * (1 - p[..., i, k])
            row.append(a)
        rows.append(torch.stack(row, -1))
    return torch.stack(rows, -2)


def test_ordering_matches_figure_1_right():
    # Figure 1/right, N = 5: rank of each source (column) for each target (row); '-' is the diagonal.
    figure = [
        [None, 1, 2, 3, 4],
        [2, None, 1, 3, 4],
        [4, 2, None, 1, 3],
        [4, 3, 2, None, 1],
        [4, 3, 2, 1, None],
    ]
    _, rank = geometric_order(5, "cpu")
    for i, row in enumerate(figure):
        for j, expected in enumerate(row):
            if expected is not None:
                assert rank[i, j].item() == expected, (i, j)
            # The direct definition of S_ij gives the same ranks: |S_ij| + 1.
            if i != j:
                assert len(closer_set(i, j, 5)) + 1 == rank[i, j].item()


@pytest.mark.parametrize("n", [2, 5, 8])
def test_geometric_attention_values_and_gradients(n):
    torch.manual_seed(n)
    logits = (torch.randn(2, 3, n, n) * 3).requires_grad_()
    fast = geometric_attention_weights(logits)
    slow = slow_geometric(logits)
    torch.testing.assert_close(fast, slow)
    assert torch.all(torch.diagonal(fast, dim1=-2, dim2=-1) == 0)
    probe = torch.randn_like(fast)
    (g_fast,) = torch.autograd.grad((fast * probe).sum(), logits)
    (g_slow,) = torch.autograd.grad((slow * probe).sum(), logits)
    torch.testing.assert_close(g_fast, g_slow)


def test_geometric_attention_masked_key_neither_receives_nor_shadows():
    torch.manual_seed(0)
    logits = torch.randn(1, 1, 6, 6) * 3
    masked = logits.clone()
    masked[..., 2] = float("-inf")
    fast = geometric_attention_weights(masked)
    assert torch.all(fast[..., 2] == 0)
    # P = 0 at the masked key: a factor (1 - 0) = 1 for every source behind it.
    torch.testing.assert_close(fast, slow_geometric(masked))
    assert torch.all(torch.isfinite(fast))


def make_attention(kind: str, d=12, heads=3, **options) -> Attention:
    torch.manual_seed(1)
    att = Attention(kind, d, heads, attention_dropout=0.0, query_dropout=0.0, **options)
    for p in att.parameters():  # biases start at zero; make every term matter
        torch.nn.init.normal_(p, std=0.5)
    return att.eval()


def heads_of(linear: torch.nn.Linear, h: torch.Tensor, heads: int) -> torch.Tensor:
    out = linear(h)
    return out.view(*out.shape[:-1], heads, -1)  # (..., N, H, d_head)


@pytest.mark.parametrize("shared", [True, False])
def test_geometric_scores_with_direction_encoding(shared):
    """Eq. 9-10: P_ij = sigmoid(alpha (W_q h_i + b_q)^T W_k h_j + beta D_ij + gamma); alpha, beta,
    gamma shared by the heads (the authors') or one per head."""
    att, heads = make_attention("geometric", shared_geometric_scale=shared), 3
    h = torch.randn(2, 5, 12)
    q, k = heads_of(att.query, h, heads), heads_of(att.key, h, heads)
    w = att.direction.weight.view(2, heads, 12)
    b = att.direction.bias.view(2, heads)
    expected = torch.zeros(2, heads, 5, 5)
    for bi in range(2):
        for hd in range(heads):
            for i in range(5):
                for j in range(5):
                    side = 0 if i <= j else 1  # W_LR for i <= j, W_RL otherwise
                    direction = w[side, hd] @ h[bi, i] + b[side, hd]
                    s = 0 if shared else hd
                    expected[bi, hd, i, j] = (
                        att.alpha[s] * (q[bi, i, hd] @ k[bi, j, hd]) + att.beta[s] * direction + att.gamma[s]
                    )
    torch.testing.assert_close(att.scores(h), expected)


def slow_positional_scores(att: Attention, h: torch.Tensor, heads: int, r=None) -> torch.Tensor:
    """Eq. 17 term by term; r=None is pure relative (Transformer-XL), else r[b, i] mixes in absolute."""
    batch, n, d = h.shape
    q, k = heads_of(att.query, h, heads), heads_of(att.key, h, heads)
    d_head = d // heads
    out = torch.zeros(batch, heads, n, n)
    for bi in range(batch):
        for hd in range(heads):
            for i in range(n):
                for j in range(n):
                    p_rel = sinusoids(torch.tensor([i - j]), d)[0]
                    p_abs = sinusoids(torch.tensor([j]), d)[0]
                    p = p_rel if r is None else r[bi, i] * p_rel + (1 - r[bi, i]) * p_abs
                    pos_key = (att.pos_key.weight @ p).view(heads, d_head)[hd]
                    a = q[bi, i, hd] @ k[bi, j, hd]
                    c = att.content_bias[hd] @ k[bi, j, hd]
                    b_e = (q[bi, i, hd] + att.pos_bias[hd]) @ pos_key
                    out[bi, hd, i, j] = (a + c + b_e) / math.sqrt(d_head)
    return out


def test_relative_position_scores():
    att = make_attention("rel")
    h = torch.randn(2, 5, 12)
    torch.testing.assert_close(att.scores(h), slow_positional_scores(att, h, 3))


def test_abs_rel_switch():
    att = make_attention("absrel")
    h = torch.randn(2, 5, 12)
    r = torch.sigmoid(att.abs_rel_switch(h))[..., 0]  # Eq. 16
    torch.testing.assert_close(att.scores(h), slow_positional_scores(att, h, 3, r))
    # The switch at its extremes gives purely relative, or purely absolute, positional keys.
    with torch.no_grad():
        att.abs_rel_switch.weight.zero_()
        att.abs_rel_switch.bias.fill_(50.0)
    torch.testing.assert_close(att.scores(h), slow_positional_scores(att, h, 3))
    with torch.no_grad():
        att.abs_rel_switch.bias.fill_(-50.0)
    torch.testing.assert_close(att.scores(h), slow_positional_scores(att, h, 3, torch.zeros(2, 5)))


def test_softmax_attention_is_scaled_dot_product():
    att = make_attention("softmax")
    h = torch.randn(2, 4, 12)
    q, k = heads_of(att.query, h, 3), heads_of(att.key, h, 3)
    expected = torch.einsum("bihd,bjhd->bhij", q, k) / 2.0
    torch.testing.assert_close(att.scores(h), expected)


@pytest.mark.parametrize("attention", ["softmax", "rel", "absrel", "geometric"])
@torch.no_grad()
def test_attention_output_and_the_plain_layer_position_by_position(attention):
    """Given the scores (tested above against their equations): each head's weights (softmax over
    the unpadded keys, or Eq. 7's geometric weights), its values mixed, the heads concatenated and
    projected (W_o), then the ungated layer, post-norm: a = LN(h + attended), LN(a + FF(a)) (Eq. 5)."""
    torch.manual_seed(5)
    d, heads, n = 12, 3, 5
    cfg = TransformerConfig(d_model=d, n_heads=heads, ff_multiplier=2, dropout=0.0, query_dropout=0.0)
    layer = Layer(cfg, attention, gated=False).eval()
    for w in layer.parameters():
        torch.nn.init.normal_(w, std=0.5)
    h = torch.randn(2, n, d)
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[1, 3:] = True
    att = layer.attention
    scores = att.scores(h)
    v = heads_of(att.value, h, heads)
    expected = torch.zeros(2, n, d)
    for bi in range(2):
        keys = [j for j in range(n) if not padding[bi, j]]
        for i in range(n):
            mixed = []
            for hd in range(heads):
                if attention == "geometric":
                    row = slow_geometric(scores[bi, hd].masked_fill(padding[bi][None], float("-inf")))[i]
                    weights = {j: row[j] for j in keys}
                else:
                    total = sum(math.exp(scores[bi, hd, i, j]) for j in keys)
                    weights = {j: math.exp(scores[bi, hd, i, j]) / total for j in keys}
                mixed.append(sum(weights[j] * v[bi, j, hd] for j in keys))
            attended = att.out.weight @ torch.cat(mixed) + att.out.bias
            a = torch.nn.functional.layer_norm(
                h[bi, i] + attended, (d,), layer.norm_attention.weight, layer.norm_attention.bias
            )
            ff = layer.ff[3].weight @ torch.relu(layer.ff[0].weight @ a + layer.ff[0].bias) + layer.ff[3].bias
            expected[bi, i] = torch.nn.functional.layer_norm(
                a + ff, (d,), layer.norm_ff.weight, layer.norm_ff.bias
            )
    out, _, gate = layer(h, padding)
    assert gate is None
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("attention", ["softmax", "compositional"])
def test_a_set_element_searches_every_element_but_itself(attention):
    """Contextual retrieval (Mittal et al., App. C.1) searches j != i: with mask_self each row's
    weights are the softmax of its scores over the other elements, and its own weight is 0."""
    att = make_attention(attention)
    h = torch.randn(2, 5, 12)
    scores = att.scores(h)
    _, weights = att(h, torch.zeros(2, 5, dtype=torch.bool), mask_self=True)
    for i in range(5):
        others = [j for j in range(5) if j != i]
        torch.testing.assert_close(weights[..., i, others], torch.softmax(scores[..., i, others], -1))
        assert torch.all(weights[..., i, i] == 0)


@pytest.mark.parametrize("attention", ["rel", "geometric"])
def test_copy_gate_equations(attention):
    """Eq. 1-5 directly; tanh replaces the update LayerNorm for gated non-geometric layers."""
    torch.manual_seed(2)
    cfg = TransformerConfig(d_model=12, n_heads=3, ff_multiplier=2, dropout=0.0, query_dropout=0.0)
    layer = Layer(cfg, attention, gated=True).eval()
    h = torch.randn(2, 5, 12)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    attended, _ = layer.attention(h, padding)
    a = torch.nn.functional.layer_norm(
        h + attended, (12,), layer.norm_attention.weight, layer.norm_attention.bias
    )

    def ffn(block, x):  # Eq. 5
        return block[3](torch.relu(block[0](x)))

    u = ffn(layer.ff, a)
    u = (
        torch.tanh(u)
        if attention == "rel"
        else torch.nn.functional.layer_norm(u, (12,), layer.norm_update.weight, layer.norm_update.bias)
    )
    g = torch.sigmoid(ffn(layer.gate, a))
    out, _, gate = layer(h, padding)
    torch.testing.assert_close(gate, g)
    torch.testing.assert_close(out, g * u + (1 - g) * h)
    assert torch.allclose(layer.gate[-1].bias, torch.full((12,), -3.0))


@pytest.mark.parametrize("attention", ["rel", "geometric"])
def test_gated_layer_drops_out_where_the_paper_says(attention, monkeypatch):
    """App. C.3: gated models drop out the content query and the position query (only the content
    query under geometric attention, whose positional channels have no redundancy); the authors'
    code also drops the attention's output before its residual and the hidden units of both
    feed-forward blocks (Eq. 5), and not the update. Each mask is recorded as it is drawn and
    applied here by hand, position by position: a mask in the wrong place (say, on the keys, as the
    authors' code has it) changes the output."""
    torch.manual_seed(4)
    p, d, heads, n = 0.5, 12, 3, 5
    cfg = TransformerConfig(d_model=d, n_heads=heads, ff_multiplier=2, dropout=p, query_dropout=p)
    layer = Layer(cfg, attention, gated=True).train()
    for w in layer.parameters():
        torch.nn.init.normal_(w, std=0.5)
    names = {id(m): name for name, m in layer.named_modules()}
    drawn: dict[str, list] = {}

    def recording(module, x):
        if not module.training or module.p == 0:
            return x
        mask = (torch.rand_like(x) >= module.p).to(x.dtype) / (1 - module.p)
        drawn.setdefault(names[id(module)], []).append((x.detach().clone(), mask))
        return x * mask

    monkeypatch.setattr(Dropout, "forward", recording)
    h = torch.randn(2, n, d)
    padding = torch.zeros(2, n, dtype=torch.bool)
    padding[1, -1] = True
    out, _, _ = layer(h, padding)
    assert sorted(drawn) == ["attention.query_dropout", "dropout", "ff.2", "gate.2"]

    att = layer.attention
    q, k, v = (
        heads_of(att.query, h, heads),
        heads_of(att.key, h, heads),
        heads_of(att.value, h, heads),
    )  # (B, N, H, dh)
    query_masks = [mask.transpose(1, 2) for _, mask in drawn["attention.query_dropout"]]  # each (B, N, H, dh)
    scale = 1 / math.sqrt(d // heads)
    scores = torch.zeros(2, heads, n, n)
    for bi in range(2):
        for hd in range(heads):
            for i in range(n):
                for j in range(n):
                    if attention == "geometric":
                        qi = q[bi, i, hd] * query_masks[0][bi, i, hd]
                        side = 0 if i <= j else 1
                        direction = (
                            att.direction.weight.view(2, heads, d)[side, hd] @ h[bi, i]
                            + att.direction.bias.view(2, heads)[side, hd]
                        )
                        scores[bi, hd, i, j] = (
                            att.alpha[0] * (qi @ k[bi, j, hd]) + att.beta[0] * direction + att.gamma[0]
                        )
                    else:
                        content_query = (q[bi, i, hd] + att.content_bias[hd]) * query_masks[0][bi, i, hd]
                        position_query = (q[bi, i, hd] + att.pos_bias[hd]) * query_masks[1][bi, i, hd]
                        pos_key = (att.pos_key.weight @ sinusoids(torch.tensor([i - j]), d)[0]).view(
                            heads, -1
                        )[hd]
                        scores[bi, hd, i, j] = (
                            content_query @ k[bi, j, hd] + position_query @ pos_key
                        ) * scale
    scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    weights = slow_geometric(scores) if attention == "geometric" else scores.softmax(-1)
    mixed = torch.einsum("bhij,bjhd->bihd", weights, v).reshape(2, n, d)
    attended = att.out(mixed) * drawn["dropout"][0][1]
    a = torch.nn.functional.layer_norm(
        h + attended, (d,), layer.norm_attention.weight, layer.norm_attention.bias
    )

    def ffn(block, mask):  # Eq. 5, its hidden units dropped
        return block[3](torch.relu(block[0](a)) * mask)

    u = ffn(layer.ff, drawn["ff.2"][0][1])
    u = (
        torch.tanh(u)
        if attention == "rel"
        else torch.nn.functional.layer_norm(u, (d,), layer.norm_update.weight, layer.norm_update.bias)
    )
    g = torch.sigmoid(ffn(layer.gate, drawn["gate.2"][0][1]))
    torch.testing.assert_close(out, g * u + (1 - g) * h)


def test_gate_drop_shuts_whole_columns_and_only_in_training():
    """Gate-drop: a dropped column's gate is 0 on every feature, so the column keeps its state
    exactly; the other columns see the gate of Eq. 3 unchanged; evaluation drops nothing."""
    torch.manual_seed(3)
    cfg = TransformerConfig(d_model=12, n_heads=3, dropout=0.0, query_dropout=0.0, gate_drop=0.3)
    layer = Layer(cfg, "geometric", gated=True)
    h = torch.randn(64, 9, 12)
    padding = torch.zeros(64, 9, dtype=torch.bool)
    _, _, open_gate = layer.eval()(h, padding)
    assert (open_gate > 0).all()
    out, _, gate = layer.train()(h, padding)
    dropped = (gate == 0).all(-1)
    assert ((gate == 0).any(-1) == dropped).all()  # whole columns or nothing
    assert torch.equal(out[dropped], h[dropped])
    torch.testing.assert_close(gate[~dropped], open_gate[~dropped])
    share = dropped.double().mean().item()
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / dropped.numel()) ** 0.5


def test_normalized_geometric_attention_rows_sum_to_one():
    logits = torch.randn(2, 3, 6, 6)
    weights = geometric_attention_weights(logits, normalize=True)
    torch.testing.assert_close(weights, slow_geometric(logits) / slow_geometric(logits).sum(-1, keepdim=True))


def test_closed_copy_gate_copies_its_input():
    cfg = TransformerConfig(d_model=12, n_heads=3, dropout=0.0, query_dropout=0.0)
    layer = Layer(cfg, "geometric", gated=True).eval()
    with torch.no_grad():
        layer.gate[-1].weight.zero_()
        layer.gate[-1].bias.fill_(-1e4)  # sigma(-1e4) == 0: the gate is closed
    h = torch.randn(2, 5, 12)
    out, _, _ = layer(h, torch.zeros(2, 5, dtype=torch.bool))
    assert torch.equal(out, h)


# ---------- Compositional attention (Mittal et al., Eq. 7-14) ----------


def slow_compositional(
    att: Attention, h: torch.Tensor, source: torch.Tensor | None = None, causal: bool = False
) -> torch.Tensor:
    """Eq. 7-14 written out per search i and retrieval j, one sample at a time; keys and values
    from `source` where given (a decoder reading its encoder), position n seeing keys 0..n if `causal`."""
    S, R, d, d_r = att.n_heads, att.n_retrievals, att.d_head, att.retrieval_dim
    out = []
    for x, y in zip(h, h if source is None else source):  # (N, D), (M, D)
        q, k = heads_of(att.query, x, S), heads_of(att.key, y, S)  # (N, S, d), (M, S, d)
        v = heads_of(att.value, y, R)  # (M, R, d)
        q_bar = heads_of(att.retrieval_query, x, S)  # (N, S, d_r)
        future = (
            torch.tensor([[m > n for m in range(len(y))] for n in range(len(x))])
            if causal
            else torch.zeros(len(x), len(y), dtype=torch.bool)
        )
        searches = []
        for i in range(S):
            search = torch.softmax(
                (q[:, i] @ k[:, i].T / math.sqrt(d)).masked_fill(future, -math.inf), dim=-1
            )  # Eq. 8
            retrievals = [search @ v[:, j] for j in range(R)]  # Eq. 10
            if att.retrieval_scores == "dot":
                keys = torch.stack([att.retrieval_key(r) for r in retrievals], 1)  # (N, R, d_r), Eq. 11-12
                scores = torch.softmax(
                    torch.einsum("nk,nrk->nr", q_bar[:, i], keys) / math.sqrt(d_r), dim=-1
                )  # Eq. 13
            else:  # the authors' Table 8: a linear score of the retrieval query beside each retrieved value
                scores = torch.softmax(
                    torch.cat([att.retrieval_score(torch.cat([q_bar[:, i], r], -1)) for r in retrievals], -1),
                    dim=-1,
                )
            searches.append(sum(scores[:, j : j + 1] * retrievals[j] for j in range(R)))
        out.append(att.out(torch.cat(searches, -1)))  # Eq. 14
    return torch.stack(out)


@pytest.mark.parametrize("retrieval_scores", ["dot", "mlp"])
def test_compositional_attention_against_its_equations(retrieval_scores):
    torch.manual_seed(3)
    att = Attention(
        "compositional", 12, 3, 0.0, 0.0, n_retrievals=4, retrieval_dim=5, retrieval_scores=retrieval_scores
    ).eval()
    h = torch.randn(2, 6, 12, requires_grad=True)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    fast, _ = att(h, padding)
    slow = slow_compositional(att, h)
    torch.testing.assert_close(fast, slow)
    (g_fast,) = torch.autograd.grad(fast.sum(), h)
    (g_slow,) = torch.autograd.grad(slow.sum(), h)
    torch.testing.assert_close(g_fast, g_slow)
    assert torch.allclose(
        att.last_value_scores.sum(-1), torch.ones(2, 3, 6)
    )  # value scores: a distribution over R


@pytest.mark.parametrize("retrieval_scores", ["dot", "mlp"])
def test_compositional_attention_reading_another_sequence_and_causal_against_its_equations(retrieval_scores):
    """The encoder-decoder's two other uses (enc_dec.py): cross-attention to the encoder's output, and
    a decoder's causal self-attention."""
    torch.manual_seed(5)
    att = Attention(
        "compositional", 12, 3, 0.0, 0.0, n_retrievals=2, retrieval_dim=5, retrieval_scores=retrieval_scores
    ).eval()
    h, memory = torch.randn(2, 4, 12), torch.randn(2, 7, 12)
    torch.testing.assert_close(
        att(h, torch.zeros(2, 7, dtype=torch.bool), source=memory)[0],
        slow_compositional(att, h, source=memory),
    )
    torch.testing.assert_close(
        att(h, torch.zeros(2, 4, dtype=torch.bool), causal=True)[0], slow_compositional(att, h, causal=True)
    )


def test_one_search_one_retrieval_is_one_head_attention():
    torch.manual_seed(4)
    comp = Attention("compositional", 8, 1, 0.0, 0.0, n_retrievals=1, retrieval_dim=4).eval()
    plain = Attention("softmax", 8, 1, 0.0, 0.0).eval()
    for name in ("query", "key", "value", "out"):
        getattr(plain, name).load_state_dict(getattr(comp, name).state_dict())
    h = torch.randn(3, 5, 8)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    torch.testing.assert_close(comp(h, padding)[0], plain(h, padding)[0])


def slow_set_attention(att, h: torch.Tensor) -> torch.Tensor:
    """The paper-shaped layer (App. C.1) per element i and search s, one sample at a time: searches
    over j != i (Eq. 7-8), each search applied to every retrieval (Eq. 10), the retrieval chosen by a
    softmax over R (Eq. 11-13), the element's own value concatenated, the output map (Eq. 14)."""
    S, R = att.searches, att.retrievals
    out = []
    for x in h:  # (N, D)
        n = len(x)
        q, k = heads_of(att.query, x, S), heads_of(att.key, x, S)
        v = heads_of(att.value, x, R or S)
        rows = []
        for i in range(n):
            parts = []
            for s in range(S):
                logits = torch.stack(
                    [
                        q[i, s] @ k[j, s] / math.sqrt(att.d_search) if j != i else torch.tensor(-math.inf)
                        for j in range(n)
                    ]
                )
                weights = torch.softmax(logits, 0)
                if R is None:
                    parts.append(weights @ v[:, s])
                    continue
                retrieved = [weights @ v[:, r] for r in range(R)]
                query = heads_of(att.retrieval_query, x[i : i + 1], S)[0, s]
                choice = torch.softmax(
                    torch.stack([query @ att.retrieval_key(r) / math.sqrt(att.d_search) for r in retrieved]),
                    0,
                )
                parts.append(sum(c * r for c, r in zip(choice, retrieved)))
            rows.append(att.out(torch.cat([*parts, att.own(x[i])])))
        out.append(torch.stack(rows))
    return torch.stack(out)


@pytest.mark.parametrize("retrievals", [None, 4])
def test_paper_shaped_set_attention_against_its_equations(retrievals):
    from trainables.models.set_attention import SetAttention

    torch.manual_seed(5)
    att = SetAttention(16, 2, retrievals)
    h = torch.randn(2, 5, 16, requires_grad=True)
    fast, slow = att(h), slow_set_attention(att, h)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(torch.autograd.grad(fast.sum(), h)[0], torch.autograd.grad(slow.sum(), h)[0])


# ---------- PANM (Le et al., Sec. 2.2-2.3) ----------


def test_address_bank_binary_codes():
    from trainables.models.panm import address_bank

    bank = address_bank(torch.tensor([3, 1022]), 4, bits=10)
    as_int = (bank * 2 ** torch.arange(9, -1, -1).float()).sum(-1).long()
    assert as_int.tolist() == [[3, 4, 5, 6], [1022, 1023, 0, 1]]  # consecutive, mod 2^b
    assert set(bank.unique().tolist()) == {0.0, 1.0}
    small = address_bank(torch.tensor([2]), 3, bits=4)
    assert small[0].long().tolist() == [
        [0, 0, 1, 0],
        [0, 0, 1, 1],
        [0, 1, 0, 0],
    ]  # the paper's example, p_B = 2... 4


def test_one_hot_mode1_pointer_dereferences_exactly_its_slot():
    from trainables.models.panm import dereference

    memory = torch.randn(2, 7, 5)
    for slot in range(7):
        w = torch.zeros(2, 7)
        w[:, slot] = 1
        assert torch.equal(dereference(w, memory), memory[:, slot])


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_pointer_initialisation(heads):
    from trainables.models.panm import address_bank, initial_pointers

    lengths = torch.tensor([5, 8])
    bank = address_bank(torch.tensor([10, 600]), 8, bits=10)
    pointers = initial_pointers(bank, lengths, heads)
    assert len(pointers) == heads
    expected_slots = [[0, 0], [4, 7], [2, 3]][:heads]  # base, end, middle of lengths 5 and 8
    for pointer, slots in zip(pointers, expected_slots):
        assert torch.equal(pointer, torch.stack([bank[0, slots[0]], bank[1, slots[1]]]))


def test_panm_heads_are_configurable_including_zero():
    from trainables.models.configs import PANMConfig
    from trainables.models.panm import PANM

    tokens, lengths = torch.randint(3, 13, (2, 6)), torch.tensor([6, 4])
    for mode1, mode2 in [(0, 0), (0, 1), (1, 0), (2, 1), (3, 2)]:
        model = PANM(
            PANMConfig(d_model=16, hidden=16, mlp_hidden=8, mode1_heads=mode1, mode2_heads=mode2),
            vocab_size=13,
        ).eval()
        out, trace = model(tokens, lengths, 5, return_activations=True)
        assert out.shape == (2, 5, 13) and torch.isfinite(out).all()
        if mode1:
            w = trace["mode1"][0]
            assert w.shape == (2, mode1, 6) and torch.all(w[1, :, 4:] == 0)  # padding slots get no weight
    with pytest.raises(ValueError, match="mode1_heads"):
        PANM(PANMConfig(mode1_heads=4), vocab_size=13)


def slow_gru(cell: torch.nn.GRUCell, x: list[float], h: list[float]) -> list[float]:
    """Cho et al.'s GRU as torch lays out its weights (reset r, update z, candidate n), unit by unit."""
    W, U, b, c = cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh
    H = len(h)

    def affine(weights, bias, v, row):
        return float(bias[row]) + sum(float(weights[row, j]) * v[j] for j in range(len(v)))

    sigmoid = lambda a: 1 / (1 + math.exp(-a))
    r = [sigmoid(affine(W, b, x, i) + affine(U, c, h, i)) for i in range(H)]
    z = [sigmoid(affine(W, b, x, H + i) + affine(U, c, h, H + i)) for i in range(H)]
    n = [math.tanh(affine(W, b, x, 2 * H + i) + r[i] * affine(U, c, h, 2 * H + i)) for i in range(H)]
    return [(1 - z[i]) * n[i] + z[i] * h[i] for i in range(H)]


def slow_mlp(net, v: list[float]) -> list[float]:
    """One hidden ReLU layer, weight by weight."""
    first, last = net[0], net[2]
    hidden = [
        max(0.0, float(first.bias[i]) + sum(float(first.weight[i, j]) * v[j] for j in range(len(v))))
        for i in range(first.out_features)
    ]
    return [
        float(last.bias[i]) + sum(float(last.weight[i, j]) * hidden[j] for j in range(len(hidden)))
        for i in range(last.out_features)
    ]


def slow_panm_decode(
    model, memory: torch.Tensor, length: int, n_steps: int, base: int = 0, inputs=None
) -> list[list[float]]:
    """PANM's decoding of one sample from Sec. 2.2-2.3, slot by slot: the address bank A[n] = n in
    b bits (base 0 at evaluation); Pointer Units h_t = GRU(p_{t-1}, h_{t-1}) (Eq. 1), w_t[n] =
    softmax_n(s cos(h_t, g^a(A[n]))) (Eq. 2), p_t = sum_n w_t[n] A[n] (Eq. 3), *p_t = sum_n w_t[n] M[n];
    Mode-2 q = g^c([*p^a ...]) (Eq. 4), w^c[n] = softmax_n(s' cos(q, M[n])) (Eq. 5), *p^c = sum_n w^c[n] M[n]
    (Eq. 6); Controller h^c_t = GRU([*p^a ..., *p^c ...], h^c_{t-1}) with h^c_0 = sum_n M[n] (Eq. 7);
    y_t = g^o([*p^a ..., *p^c ..., h^c_t]). Mode-1 pointers start at the base and end addresses.
    In training the bank starts at a random base p_B: A[n] = (p_B + n) mod 2^b. Without Mode-1
    heads the Mode-2 query reads h^c_{t-1} (App. D.5); a decoder input z_t joins the Controller's
    input (Eq. 7, App. D.3)."""
    cfg = model.cfg
    M = [[float(v) for v in memory[n]] for n in range(length)]
    bits = cfg.address_bits
    A = [[float(((base + n) % 2**bits >> (bits - 1 - k)) & 1) for k in range(bits)] for n in range(length)]
    sharp_a, sharp_c = (math.exp(v) for v in model.log_sharpness.tolist())

    def cos(a, b):
        return (
            sum(x * y for x, y in zip(a, b))
            / max(math.sqrt(sum(x * x for x in a)), 1e-12)
            / max(math.sqrt(sum(y * y for y in b)), 1e-12)
        )

    def softmax(scores):
        top = max(scores)
        e = [math.exp(v - top) for v in scores]
        return [v / sum(e) for v in e]

    def read(w):
        return [sum(w[n] * M[n][d] for n in range(length)) for d in range(len(M[0]))]

    keys = [[slow_mlp(g, A[n]) for n in range(length)] for g in model.address_keys]
    pointers = [A[0], A[length - 1], A[(length - 1) // 2]][: cfg.mode1_heads]
    states = [[0.0] * cfg.hidden for _ in range(cfg.mode1_heads)]
    control = [sum(M[n][d] for n in range(length)) for d in range(len(M[0]))]
    outputs = []
    for t in range(n_steps):
        values = []
        for h, unit in enumerate(model.pointer_units):
            states[h] = slow_gru(unit, pointers[h], states[h])
            w = softmax([sharp_a * cos(states[h], keys[h][n]) for n in range(length)])
            pointers[h] = [sum(w[n] * A[n][k] for n in range(length)) for k in range(bits)]
            values.append(read(w))
        mode1 = [v for value in values for v in value]
        for g in model.mode2_queries:
            q = slow_mlp(g, mode1 or control)
            values.append(read(softmax([sharp_c * cos(q, M[n]) for n in range(length)])))
        flat = [v for value in values for v in value]
        control = slow_gru(
            model.controller, flat + ([float(v) for v in inputs[t]] if inputs is not None else []), control
        )
        outputs.append(slow_mlp(model.output, flat + control))
    return outputs


@pytest.mark.parametrize("mode1,mode2", [(2, 1), (1, 2)])
def test_panm_decoding_against_its_equations(mode1, mode2):
    from trainables.models.configs import PANMConfig
    from trainables.models.panm import PANM

    torch.manual_seed(0)
    model = PANM(
        PANMConfig(
            d_model=6,
            hidden=6,
            mlp_hidden=5,
            address_bits=4,
            mode1_heads=mode1,
            mode2_heads=mode2,
            sharpness=3.0,
        ),
        vocab_size=7,
    ).eval()
    tokens, lengths = torch.randint(3, 7, (2, 5)), torch.tensor([5, 3])
    with torch.no_grad():
        out = model(tokens, lengths, 4)
        memory = model.encoder(tokens, lengths, None)
        for b in range(2):
            expected = torch.tensor(slow_panm_decode(model, memory[b], int(lengths[b]), 4))
            assert torch.allclose(out[b], expected, atol=1e-5), (b, (out[b] - expected).abs().max())


def test_panm_training_base_no_mode1_heads_and_a_decoder_input_against_its_equations(monkeypatch):
    """What evaluation never shows: the random base address of training (Sec. 2.2: the bank is
    p_B, p_B + 1, ... mod 2^b), a PANM without Mode-1 heads (its Mode-2 query reads the Controller,
    App. D.5), and a decoder input z_t in the Controller's input (SCAN's z_t = Decoder(y_<t), App. D.3)."""
    from trainables.models.configs import PANMConfig
    from trainables.models.panm import PointerDecoder

    torch.manual_seed(0)
    memory, lengths, z = torch.randn(2, 5, 6), torch.tensor([5, 3]), torch.randn(4, 2, 3)
    bases = torch.tensor([13, 6])  # 13 + 4 wraps around 2^4
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: bases)
    for mode1, mode2, inputs in [(2, 1, None), (0, 2, None), (2, 1, z)]:
        model = PointerDecoder(
            PANMConfig(
                d_model=6,
                hidden=6,
                mlp_hidden=5,
                address_bits=4,
                mode1_heads=mode1,
                mode2_heads=mode2,
                sharpness=3.0,
            ),
            vocab_size=7,
            input_size=0 if inputs is None else 3,
        ).train()
        with torch.no_grad():
            state = model.begin(memory, lengths)
            out = torch.stack([model.step(state, None if inputs is None else inputs[t]) for t in range(4)], 1)
            for b in range(2):
                expected = torch.tensor(
                    slow_panm_decode(
                        model,
                        memory[b],
                        int(lengths[b]),
                        4,
                        base=int(bases[b]),
                        inputs=None if inputs is None else inputs[:, b],
                    )
                )
                assert torch.allclose(out[b], expected, atol=1e-5), (
                    mode1,
                    mode2,
                    b,
                    (out[b] - expected).abs().max(),
                )


# ---------- DNC (Graves et al. 2016, Methods; Csordás & Schmidhuber 2019) ----------


def slow_dnc_step(state: dict, xi: dict, deallocate: bool, sharpen_links: bool) -> dict:
    """One memory step of a single sample, cell by cell, from the papers' equations."""
    M, u_prev, p_prev, L_prev = (
        state["memory"][0],
        state["usage"][0],
        state["precedence"][0],
        state["links"][0],
    )
    w_r_prev, w_w_prev = state["read_weights"][0], state["write_weights"][0]
    N, R = M.shape[0], w_r_prev.shape[0]
    eps = 1e-6

    def cosine(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()) + eps)

    def content(memory, key, beta):
        scores = torch.tensor([beta * cosine(memory[i], key) for i in range(N)])
        return torch.softmax(scores, 0)

    psi = torch.tensor(
        [
            math.prod(1 - float(xi["free_gates"][0, r]) * float(w_r_prev[r, i]) for r in range(R))
            for i in range(N)
        ]
    )
    u = torch.tensor(
        [
            (float(u_prev[i]) + float(w_w_prev[i]) - float(u_prev[i]) * float(w_w_prev[i])) * float(psi[i])
            for i in range(N)
        ]
    )
    # Allocation: free list phi = cells by ascending usage.
    u_eps = u * (1 - eps) + eps
    phi = sorted(range(N), key=lambda i: float(u_eps[i]))
    a = torch.zeros(N)
    for j, cell in enumerate(phi):
        a[cell] = (1 - u_eps[cell]) * math.prod(float(u_eps[phi[k]]) for k in range(j))
    c_w = content(M, xi["write_key"][0], float(xi["write_strength"][0, 0]))
    g_a, g_w = float(xi["allocation_gate"][0, 0]), float(xi["write_gate"][0, 0])
    w_w = torch.tensor([g_w * (g_a * float(a[i]) + (1 - g_a) * float(c_w[i])) for i in range(N)])
    e, v = xi["erase"][0], xi["write"][0]
    M_new = torch.zeros_like(M)
    for i in range(N):
        for k in range(M.shape[1]):
            keep = 1 - float(w_w[i]) * float(e[k])
            if deallocate:
                keep *= float(psi[i])  # freed cells are erased (Csordás & Schmidhuber, Sec. 3.2)
            M_new[i, k] = float(M[i, k]) * keep + float(w_w[i]) * float(v[k])
    L = torch.zeros(N, N)
    for i in range(N):
        for j in range(N):
            if i != j:
                L[i, j] = (1 - float(w_w[i]) - float(w_w[j])) * float(L_prev[i, j]) + float(w_w[i]) * float(
                    p_prev[j]
                )
    p = (1 - float(w_w.sum())) * p_prev + w_w
    reads, weights = [], []
    for r in range(R):
        f = torch.tensor([sum(float(L[i, j]) * float(w_r_prev[r, j]) for j in range(N)) for i in range(N)])
        b = torch.tensor([sum(float(L[j, i]) * float(w_r_prev[r, j]) for j in range(N)) for i in range(N)])
        if sharpen_links:

            def sharp(d, s):
                d = d + eps
                d = (d / d.max()) ** s
                return d / max(float(d.sum()), eps)

            f, b = sharp(f, float(xi["sharpness"][0, 0, r])), sharp(b, float(xi["sharpness"][0, 1, r]))
        c = content(M_new, xi["read_keys"][0, r], float(xi["read_strengths"][0, r]))
        pi = xi["read_modes"][0, r]
        w = pi[0] * b + pi[1] * c + pi[2] * f
        weights.append(w)
        reads.append(sum(float(w[i]) * M_new[i] for i in range(N)))
    return {
        "memory": M_new,
        "usage": u,
        "precedence": p,
        "links": L,
        "write_weights": w_w,
        "read_weights": torch.stack(weights),
        "reads": torch.stack(reads),
    }


@pytest.mark.parametrize("deallocate,sharpen_links", [(True, True), (False, False)])
def test_dnc_memory_step_matches_its_equations(deallocate, sharpen_links):
    from trainables.models.configs import DNCConfig
    from trainables.models.dnc import DNCMemory

    torch.manual_seed(4)
    memory = DNCMemory(
        DNCConfig(d_model=6, n_cells=5, n_read_heads=2, deallocate=deallocate, sharpen_links=sharpen_links)
    )
    state = memory.initial_state(1, "cpu")
    # A state mid-sequence: some memory, usage, links and weights.
    state = {
        "memory": torch.randn(1, 5, 6),
        "usage": torch.rand(1, 5),
        "precedence": torch.softmax(torch.randn(1, 5), -1) * 0.8,
        "links": torch.rand(1, 5, 5) * 0.2 * (1 - torch.eye(5)),
        "read_weights": torch.softmax(torch.randn(1, 2, 5), -1),
        "write_weights": torch.softmax(torch.randn(1, 5), -1) * 0.9,
        "reads": torch.zeros(1, 2, 6),
    }
    xi = memory.interface(torch.randn(1, memory.interface_size) * 2)
    fast = memory(state, xi)
    slow = slow_dnc_step(state, xi, deallocate, sharpen_links)
    for key, value in slow.items():
        torch.testing.assert_close(fast[key][0], value, msg=key)


def test_dnc_interface_squashes_each_field_as_the_papers_say():
    """Graves et al., Methods, 'Interface parameters': the raw vector is read in the paper's order
    [k_r (R x W), beta_r (R), k_w (W), beta_w, e (W), v (W), f (R), g_a, g_w, pi (3R)], then
    Csordas & Schmidhuber's link sharpness (2R) and masks (R x W, W); strengths and sharpness
    oneplus(x) = 1 + log(1 + e^x), gates, erase and masks the logistic sigmoid, each head's read
    modes a softmax over (backward, content, forward); keys and the write vector as they are."""
    from trainables.models.configs import DNCConfig
    from trainables.models.dnc import DNCMemory

    R, W = 2, 3
    memory = DNCMemory(
        DNCConfig(d_model=W, n_cells=4, n_read_heads=R, sharpen_links=True, masked_addressing=True)
    )
    torch.manual_seed(5)
    vector = torch.randn(1, memory.interface_size) * 2
    values = iter(vector[0].tolist())
    take = lambda n: [next(values) for _ in range(n)]  # noqa: E731
    oneplus = lambda x: 1 + math.log1p(math.exp(x))  # noqa: E731
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731

    def softmax(xs):
        total = sum(math.exp(x) for x in xs)
        return [math.exp(x) / total for x in xs]

    expected = {
        "read_keys": [take(W) for _ in range(R)],
        "read_strengths": [oneplus(x) for x in take(R)],
        "write_key": take(W),
        "write_strength": [oneplus(x) for x in take(1)],
        "erase": [sigmoid(x) for x in take(W)],
        "write": take(W),
        "free_gates": [sigmoid(x) for x in take(R)],
        "allocation_gate": [sigmoid(x) for x in take(1)],
        "write_gate": [sigmoid(x) for x in take(1)],
        "read_modes": [softmax(take(3)) for _ in range(R)],
        "sharpness": [[oneplus(x) for x in take(R)] for _ in range(2)],
        "read_masks": [[sigmoid(x) for x in take(W)] for _ in range(R)],
        "write_mask": [sigmoid(x) for x in take(W)],
    }
    assert next(values, None) is None  # every value of the vector read
    xi = memory.interface(vector)
    assert set(xi) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(xi[key][0], torch.tensor(value), msg=key)


def test_dnc_masked_content_addressing():
    """Csordás & Schmidhuber (2019)'s masked addressing: each head's key and every memory row are multiplied
    by the head's mask before the cosine, C[i] = softmax_i(beta cos(M[i] * m, k * m)); without a
    mask, Graves et al.'s content weights."""
    from trainables.models.dnc import EPS, content_weights

    torch.manual_seed(7)
    memory, keys, strengths, masks = (
        torch.randn(2, 5, 4),
        torch.randn(2, 3, 4),
        torch.rand(2, 3) * 5 + 1,
        torch.rand(2, 3, 4),
    )
    for mask in (masks, None):
        expected = torch.zeros(2, 3, 5)
        for b in range(2):
            for h in range(3):
                m = mask[b, h] if mask is not None else torch.ones(4)
                key = keys[b, h] * m
                cos = [
                    float((memory[b, i] * m) @ key)
                    / (float((memory[b, i] * m).norm()) * float(key.norm()) + EPS)
                    for i in range(5)
                ]
                e = [math.exp(float(strengths[b, h]) * c) for c in cos]
                expected[b, h] = torch.tensor([v / sum(e) for v in e])
        torch.testing.assert_close(content_weights(memory, keys, strengths, mask), expected)


# ---------- ACT (NDR paper App. A, Eq. 11-15) ----------


@pytest.mark.parametrize("variant", ["graves", "dehghani"])
def test_act_halting_matches_its_definition(variant):
    from trainables.models.transformer import UniversalTransformerClassifier

    torch.manual_seed(5)
    cfg = TransformerConfig(d_model=8, n_heads=2, act=variant, act_threshold=0.99)
    model = UniversalTransformerClassifier(
        cfg, "softmax", False, vocab_size=10, n_classes=3, pad_id=0, bos_id=1, eos_id=2
    )
    with torch.no_grad():  # some columns halt early, some reach the last step
        model.halting.bias.fill_(-1.5)
        model.halting.weight.normal_(std=1.0)
    mix = torch.randn(8, 8)

    def step(h):  # any per-step update will do: ACT only weighs the states it produces
        return torch.tanh(h @ mix)

    h0 = torch.randn(3, 6, 8)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    t_max = 7
    out, remainders, _ = model.adaptive(h0, padding, t_max, step)

    halts = set()
    states = [h0]
    for _ in range(t_max):
        states.append(step(states[-1]))
    for b in range(3):
        for i in range(6):
            if padding[b, i]:
                assert torch.equal(out[b, i], torch.zeros(8)) and remainders[b, i] == 0
                continue
            p = [
                torch.sigmoid(model.halting(states[t][b, i])).item() for t in range(t_max)
            ]  # p_t from the state before step t
            reached = [t for t in range(t_max) if sum(p[: t + 1]) >= 0.99]
            halt = reached[0] if reached else (t_max - 1 if variant == "graves" else None)  # Eq. 12, 0-based
            halts.add("early" if reached and reached[0] < t_max - 1 else "late")
            weights = [
                p[t] if halt is None or t < halt else (1 - sum(p[:halt]) if t == halt else 0.0)
                for t in range(t_max)
            ]
            if variant == "graves":
                expected = sum(weights[t] * states[t + 1][b, i] for t in range(t_max))  # Eq. 15
            else:
                expected = torch.zeros(8)
                for t in range(t_max):
                    expected = weights[t] * states[t + 1][b, i] + (1 - weights[t]) * expected
            torch.testing.assert_close(out[b, i], expected)
            assert remainders[b, i].item() == pytest.approx(0.0 if halt is None else 1 - sum(p[:halt]))
    assert halts == {"early", "late"}


def test_act_ponder_cost_is_alpha_over_n_times_the_summed_remainders():
    """App. A: L_ACT = alpha / N * sum_i R_i over the N columns of a sequence, averaged over the
    batch; then with padding, as the authors' code computes it."""
    from trainables.models.transformer import UniversalTransformerClassifier

    torch.manual_seed(6)
    cfg = TransformerConfig(
        d_model=8, n_heads=2, n_layers=5, act="graves", act_threshold=0.99, act_loss_weight=0.03
    )
    model = UniversalTransformerClassifier(
        cfg, "softmax", False, vocab_size=10, n_classes=3, pad_id=0, bos_id=1, eos_id=2
    )
    seen = []
    adaptive = model.adaptive
    model.adaptive = lambda *args: seen.append(adaptive(*args)) or seen[-1]
    tokens = torch.randint(3, 10, (4, 6))
    model(tokens, torch.full((4,), 6))
    remainders = seen[0][1].detach()  # (B, N) with N = 6 tokens + the BOS and EOS markers
    n = remainders.shape[1]
    expected = sum(0.03 / n * sum(float(remainders[b, i]) for i in range(n)) for b in range(4)) / 4
    assert n == 8 and model.aux_loss.item() == pytest.approx(expected, rel=1e-6) and expected > 0
    # With padding the two differ: the paper divides each sequence's sum by its own length, the
    # authors' code (act_transformer.py, remainders.mean()) by the padded width; the authors' is
    # what trained Table 6, and padding columns start halted, with no remainder.
    seen.clear()
    lengths = torch.tensor([6, 3, 6, 2])
    model(tokens.masked_fill(torch.arange(6)[None] >= lengths[:, None], 0), lengths)
    remainders = seen[0][1].detach()
    assert all(float(remainders[b, i]) == 0 for b in range(4) for i in range(int(lengths[b]) + 2, n))
    authors = 0.03 * sum(float(remainders[b, i]) for b in range(4) for i in range(n)) / (4 * n)
    assert model.aux_loss.item() == pytest.approx(authors, rel=1e-6)


def test_sinusoids_are_vaswani_et_al_s_equations():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), negative
    positions (the relative encodings' offsets) included."""
    from trainables.models.transformer import sinusoids

    d = 10
    positions = torch.tensor([-3, 0, 1, 7, 40])
    out = sinusoids(positions, d)
    for row, pos in enumerate(positions.tolist()):
        for k in range(d):
            angle = pos / 10000 ** ((k - k % 2) / d)
            assert float(out[row, k]) == pytest.approx(
                math.sin(angle) if k % 2 == 0 else math.cos(angle), abs=1e-5
            )


def test_cosine_learning_rate_is_loshchilov_and_hutters_annealing_to_zero():
    """lr_t = lr (1 + cos(pi t / T)) / 2 (SGDR without restarts, eta_min 0), checked against
    torch's CosineAnnealingLR stepped once per training step, as the triangles' authors step theirs
    once per epoch."""
    from trainables.config import parse_trial_config
    from trainables.steps import lr_factor

    cfg = parse_trial_config(
        {"task": "copy", "model": "lstm_seq2seq", "lr": 3e-3, "n_iters": 50, "lr_schedule": "cosine"}
    )
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.n_iters)
    for iteration in range(1, cfg.n_iters + 1):
        assert cfg.lr * lr_factor(cfg, iteration) == pytest.approx(
            optimizer.param_groups[0]["lr"], rel=1e-9, abs=1e-15
        )
        assert lr_factor(cfg, iteration) == pytest.approx(
            (1 + math.cos(math.pi * (iteration - 1) / cfg.n_iters)) / 2
        )
        optimizer.step()
        scheduler.step()
    assert lr_factor(parse_trial_config({"task": "copy", "model": "lstm_seq2seq"}), 7) == 1.0
