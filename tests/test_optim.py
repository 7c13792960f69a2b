"""Optimizers against references: AdamW vs torch.optim.AdamW, LAMB vs the paper's algorithm in float64 numpy;
the sums-of-squares hooks under simulated sharding; clipping; schedules."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from pretrain import config as C
from pretrain import optim
from pretrain.optim import AdamW, Lamb, Schedule, functional, param_groups


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, 4))


@pytest.mark.parametrize("fused", [True, False])
def test_adamw_matches_torch_over_50_steps(monkeypatch, fused):
    """Both paths: torch's fused kernel (the default wherever torch has it, so also on CPU) and ptm's arithmetic."""
    kernel_calls = []
    kernel = torch._fused_adamw_
    monkeypatch.setattr(torch, "_fused_adamw_", lambda *a, **k: kernel_calls.append(1) or kernel(*a, **k))
    ours, ref = mlp(), mlp()
    kw = {"lr": 3e-3, "betas": (0.9, 0.99), "eps": 1e-8}
    opt = AdamW(param_groups(ours, 0.1), **kw) if fused else AdamW(param_groups(ours, 0.1), fused=False, **kw)
    ref_opt = torch.optim.AdamW(param_groups(ref, 0.1), **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert any((p - q).abs().max() > 0 for p, q in zip(ours.parameters(), mlp().parameters()))  # it did train
    assert len(kernel_calls) == (100 if fused else 0)  # one call per step and param group, all tensors at once


# ------------------------------------------------------------------------------------------------- LAMB

def lamb_reference(weights, grads, groups, lr, beta1, beta2, eps):
    """You et al. 2019, Algorithm 2, in float64 numpy. weights: arrays; grads[t][i]: gradient of weight i at step
    t (None: no gradient, the weight is skipped); groups[i]: (weight_decay, adapt)."""
    w = [np.array(x, dtype=np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    steps = [0] * len(w)
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            if g is None:
                continue
            steps[i] += 1
            t = steps[i]
            decay, adapt = groups[i]
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat, v_hat = m[i] / (1 - beta1 ** t), v[i] / (1 - beta2 ** t)
            r = m_hat / (np.sqrt(v_hat) + eps) + decay * w[i]
            w_norm, r_norm = np.linalg.norm(w[i]), np.linalg.norm(r)
            ratio = w_norm / r_norm if adapt and w_norm > 0 and r_norm > 0 else 1.0
            w[i] = w[i] - lr * ratio * r
    return w


def lamb_case(steps=20):
    """Weights of very different scales, a zero weight (||w|| = 0), a weight with zero gradients and no decay
    (||u|| = 0), a weight that gets no gradient on some steps, and biases excluded from decay and adaptation."""
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(6, 5)) * 100, rng.normal(size=(4, 3)) * 0.01, np.zeros((3, 3)), rng.normal(size=(2, 4)),
               rng.normal(size=(5, 2)), rng.normal(size=6), rng.normal(size=4)]
    groups = [(0.01, True)] * 5 + [(0.0, False)] * 2
    groups[3] = (0.0, True)  # zero gradients and no decay: u = 0
    grads = []
    for t in range(steps):
        g = [rng.normal(size=w.shape) for w in weights]
        g[3] = np.zeros_like(weights[3])
        g[4] = None if t % 3 == 1 else g[4]
        grads.append(g)
    return weights, grads, groups


def run_lamb(weights, grads, groups, dtype, opt_cls=Lamb, **kw):
    params = [torch.tensor(w, dtype=dtype, requires_grad=True) for w in weights]
    pg = [{"params": [p], "weight_decay": d, "adapt": a} for p, (d, a) in zip(params, groups)]
    opt = opt_cls(pg, lr=0.01, betas=(0.9, 0.999), eps=1e-6, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else torch.tensor(g, dtype=dtype)
        opt.step()
    return [p.detach().double().numpy() for p in params]


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_lamb_matches_the_paper(dtype, tol):
    weights, grads, groups = lamb_case()
    expected = lamb_reference(weights, grads, groups, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6)
    got = run_lamb(weights, grads, groups, dtype)
    for i, (g, e, w) in enumerate(zip(got, expected, weights)):
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol * np.abs(w).max(initial=1e-3), err_msg=f"weight {i}")
    np.testing.assert_array_equal(got[3], torch.tensor(weights[3], dtype=dtype).double())  # ||u|| = 0: unchanged
    assert np.abs(got[2]).max() > 0  # ||w|| = 0: ratio 1, the zero weight moves


def test_lamb_trust_ratio_is_per_parameter():
    """With adaptation every weight moves by about lr * ||w|| on the first step, whatever its scale: the ratio is
    ||w|| / ||u|| of each parameter, not one for all."""
    torch.manual_seed(0)
    big, small = torch.randn(8, 8) * 100, torch.randn(8, 8) * 0.01
    params = [nn.Parameter(big.clone()), nn.Parameter(small.clone())]
    for p in params:
        p.grad = torch.randn(8, 8)
    Lamb(params, lr=0.01, weight_decay=0.0).step()
    rel = [((p.detach() - w).norm() / w.norm()).item() for p, w in zip(params, (big, small))]
    assert rel == pytest.approx([0.01, 0.01], rel=1e-3)
    params = [nn.Parameter(big.clone()), nn.Parameter(small.clone())]  # without adaptation: the same Adam step
    for p in params:
        p.grad = torch.randn(8, 8)
    Lamb(params, lr=0.01, weight_decay=0.0, adapt=False).step()
    steps = [(p.detach() - w).norm().item() for p, w in zip(params, (big, small))]
    assert steps[0] == pytest.approx(steps[1], rel=1e-3)


class ChunkedLamb(Lamb):
    """LAMB over shards: each optimizer parameter is a chunk of a whole weight (`owner[i]`: which weight). The hook
    adds the chunks' partial sums per weight, as an all-reduce over the shards' process group would."""

    def __init__(self, params, owner, **kw):
        super().__init__(params, **kw)
        self.owner = {id(p): o for p, o in zip(params, owner)}

    def sums_of_squares(self, params, updates):
        w_sq, u_sq = super().sums_of_squares(params, updates)
        idx = torch.tensor([self.owner[id(p)] for p in params])
        n = len(set(self.owner.values()))
        return (torch.zeros(n, dtype=w_sq.dtype).index_add_(0, idx, w_sq)[idx],
                torch.zeros(n, dtype=u_sq.dtype).index_add_(0, idx, u_sq)[idx])


@pytest.mark.parametrize("opt_cls, same", [(ChunkedLamb, True), (Lamb, False)])
def test_sharded_norm_hook_gives_the_unsharded_result(opt_cls, same):
    weights, grads, _ = lamb_case(steps=10)
    weights, grads = weights[:3], [g[:3] for g in grads]
    whole = run_lamb(weights, grads, [(0.01, True)] * 3, torch.float64)
    splits = [[7, 13, 10], [5, 7], [4, 5]]  # uneven chunks of each flattened weight

    def chunks(arrays):
        return [c for a, s in zip(arrays, splits) for c in np.split(a.reshape(-1), np.cumsum(s)[:-1])]

    owner = [i for i, s in enumerate(splits) for _ in s]
    kw = {"owner": owner} if opt_cls is ChunkedLamb else {}
    params = [torch.tensor(c, dtype=torch.float64, requires_grad=True) for c in chunks(weights)]
    opt = opt_cls(params, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, **kw)
    for step_grads in grads:
        for p, g in zip(params, chunks(step_grads)):
            p.grad = torch.tensor(g)
        opt.step()
    flat = np.concatenate([p.detach().numpy() for p in params])
    assert np.allclose(flat, np.concatenate([w.reshape(-1) for w in whole]), rtol=1e-12, atol=1e-12) == same


@pytest.mark.parametrize("cls", [AdamW, Lamb])
def test_multi_tensor_step_batches_parameters_and_equals_the_per_parameter_loop(monkeypatch, cls):
    """One `functional` call per param group and step count with foreach (a parameter that skipped steps gets a
    call of its own), one per parameter without; both give the same weights."""
    calls = []
    name = "adamw_update" if cls is AdamW else "lamb_update"
    original = getattr(functional, name)
    monkeypatch.setattr(functional, name, lambda params, *a, **k: calls.append(len(params)) or original(params, *a, **k))
    models = {}
    for foreach in (True, False):
        model = mlp()
        opt = cls(param_groups(model, 0.1), lr=1e-2, foreach=foreach, **({"fused": False} if cls is AdamW else {}))
        gen = torch.Generator().manual_seed(1)
        for step in range(4):
            calls.clear()
            opt.zero_grad()
            x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
            nn.functional.mse_loss(model(x), y).backward()
            if step == 1:
                model[0].bias.grad = None  # this parameter skips a step: its step count lags the rest
            opt.step()
        models[foreach] = model
        # groups: 2 weights (decay) + 4 biases/norm weights (no decay), one of which lags a step
        assert sorted(calls) == ([1, 2, 3] if foreach else [1] * 6), calls
    for p, q in zip(models[True].parameters(), models[False].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("cls", [AdamW, Lamb])
def test_idle_parameters_of_a_flat_tensor_step_as_parameters_without_gradient(monkeypatch, cls, foreach):
    """DeepSpeed hands the optimizer flat tensors that pack many parameters (ZeRO partitions), with zeros as the
    gradient of a parameter the step did not reach (ERNIE 2.0's heads of later stages). Named idle under a layout,
    such a parameter is left as it is (no weight decay, moments untouched) and counts its steps from its first: the
    weights of the same optimizer stepping whole parameters whose gradient is None (torch's AdamW for AdamW)."""
    from pretrain.parallel import layout as L

    monkeypatch.setattr(L.mcore, "dp_rank", lambda: 0)
    monkeypatch.setattr(L.mcore, "tp_size", lambda: 1)
    model, ref = mlp(), mlp()
    names = {id(p): n for n, p in model.named_parameters()}
    flats, tensors = [], []
    for group in param_groups(model, 0.1):  # each group flattened end to end, with a gap of 3 elements after it
        flat = torch.cat([p.detach().reshape(-1) for p in group["params"]] + [torch.zeros(3)]).requires_grad_()
        segments, at = [], 0
        for p in group["params"]:
            segments.append(L.Segment(names[id(p)], 0, at, p.numel()))
            at += p.numel()
        flats.append({**group, "params": [flat]})
        tensors.append((flat, segments))
    kw = {"lr": 1e-2, "foreach": foreach, **({"fused": False} if cls is AdamW and not foreach else {})}
    opt = cls(flats, **kw)
    opt.layout = L.Layout(model, tensors, partitioned=False)
    ref_opt = (torch.optim.AdamW(param_groups(ref, 0.1), lr=1e-2) if cls is AdamW
               else Lamb(param_groups(ref, 0.1), **kw))
    idle = [{"3.weight", "3.bias"}] * 3 + [set(), {"1.weight"}, set()]  # a head that joins; a weight that pauses
    gen = torch.Generator().manual_seed(1)
    for step_idle in idle:
        ref_opt.zero_grad()
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        nn.functional.mse_loss(ref(x), y).backward()
        for (flat, segments), group in zip(tensors, param_groups(ref, 0.1)):
            flat.grad = torch.cat([torch.zeros(p.numel()) if s.name in step_idle else p.grad.reshape(-1)
                                   for p, s in zip(group["params"], segments)] + [torch.zeros(3)])
        for n, p in ref.named_parameters():
            if n in step_idle:
                p.grad = None
        opt.idle = frozenset(step_idle)
        opt.step()
        opt.rested()
        ref_opt.step()
    assert opt.idle_steps == {"3.weight": 3, "3.bias": 3, "1.weight": 1}
    for (flat, segments), group in zip(tensors, param_groups(ref, 0.1)):
        for p, s in zip(group["params"], segments):
            torch.testing.assert_close(flat.detach()[s.offset:s.offset + s.length], p.detach().reshape(-1),
                                       rtol=0, atol=1e-6, msg=s.name)
        assert not flat.detach()[-3:].any()


@pytest.mark.parametrize("foreach", [True, False])
def test_lamb_leaves_a_tensor_of_idle_parameters_alone(monkeypatch, foreach):
    """DeepSpeed steps each param group (ZeRO-3: each sub-group) in a call of its own; a rank's partition of one may
    hold only idle parameters (the tail of a group: heads a stage trains not). LAMB leaves it as it is and still
    takes part in the trust ratios' all-reduce (the other ranks' pieces wait for it); it stepped nothing there
    (a multi-tensor call refuses an empty list)."""
    from pretrain.parallel import layout as L

    monkeypatch.setattr(L.mcore, "dp_rank", lambda: 0)
    monkeypatch.setattr(L.mcore, "tp_size", lambda: 1)
    model = mlp()
    named = dict(model.named_parameters())
    groups, tensors = [], []
    for names in (["0.weight", "0.bias"], ["3.weight", "3.bias"]):
        flat = torch.cat([named[n].detach().reshape(-1) for n in names]).requires_grad_()
        flat.grad = torch.randn_like(flat)
        starts = np.cumsum([0] + [named[n].numel() for n in names])
        tensors.append((flat, [L.Segment(n, 0, int(at), named[n].numel()) for n, at in zip(names, starts)]))
        groups.append({"params": [flat], "weight_decay": 0.1})
    opt = Lamb(groups, lr=1e-2, foreach=foreach)
    opt.layout = L.Layout(model, tensors, partitioned=False)
    opt.idle = frozenset({"3.weight", "3.bias"})
    reduced = []
    monkeypatch.setattr(L.dev, "all_reduce", lambda t, group=None: reduced.append(t.numel()) or t)
    monkeypatch.setattr(L.mcore, "dp_group", lambda: None)
    opt.layout.partitioned = True  # (ZeRO's partitions: per-parameter sums are all-reduced over the DP ranks)
    before = [t.detach().clone() for t, _ in tensors]
    opt.step()
    assert not torch.equal(tensors[0][0].detach(), before[0]) and torch.equal(tensors[1][0].detach(), before[1])
    assert len(reduced) == 4  # two sums of squares (weights, updates) per group: the idle one's too


# -------------------------------------------------------------------------------------- groups, build

def test_param_groups_exclude_biases_and_norms():
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "fc": nn.Linear(4, 4), "ln": nn.LayerNorm(4),
                           "frozen": nn.Linear(4, 4)})
    model["frozen"].requires_grad_(False)
    decay, plain = param_groups(model, 0.1)
    assert decay["params"] == [model["emb"].weight, model["fc"].weight] and decay["weight_decay"] == 0.1
    assert plain["params"] == [model["fc"].bias, model["ln"].weight, model["ln"].bias]
    assert plain["weight_decay"] == 0.0 and plain["adapt"] is False


def test_build_from_config():
    cfg = C.load("bert-tiny", ["optimizer.name=lamb", "optimizer.betas=[0.8, 0.9]"]).optimizer
    opt = optim.build(mlp(), cfg)
    assert isinstance(opt, Lamb)
    assert [(g["lr"], g["betas"], g["eps"], g["weight_decay"], g["adapt"]) for g in opt.param_groups] == [
        (cfg.lr, (0.8, 0.9), cfg.eps, 0.01, True), (cfg.lr, (0.8, 0.9), cfg.eps, 0.0, False)]
    assert isinstance(optim.build(mlp(), C.load("bert-tiny").optimizer), AdamW)
    assert tuple(optim.OPTIMIZERS) == C.OPTIMIZERS
    assert not opt.foreach  # auto: per parameter on CPU tensors
    assert optim.build(mlp(), C.load("bert-tiny", ["optimizer.name=lamb", "optimizer.multi_tensor=on"]).optimizer).foreach


# ------------------------------------------------------------------------------------------- schedules

@pytest.mark.parametrize("kind, middle", [("linear", 0.55), ("poly", 0.1 + 0.9 * 0.25), ("cosine", 0.55),
                                          ("constant", 1.0)])
def test_schedule_key_steps(kind, middle):
    s = Schedule(lr=1.0, total_steps=110, warmup_steps=10, kind=kind, min_lr=0.1, power=2.0)
    end = 1.0 if kind == "constant" else 0.1
    assert [s(0), s(5), s(10), s(60), s(110), s(500)] == pytest.approx([0.0, 0.5, 1.0, middle, end, end])


def test_cosine_quarter():
    s = Schedule(lr=2.0, total_steps=100, kind="cosine")
    assert s(25) == pytest.approx(1.0 + math.cos(math.pi / 4))


def test_scheduler_drives_the_optimizer_lr():
    s = Schedule.from_config(C.load("bert-tiny", ["optimizer.warmup_steps=0.1", "optimizer.schedule=cosine",
                                                "optimizer.lr=1e-3"]).optimizer,
                             total_steps=50)
    assert (s.warmup_steps, s.lr, s.kind) == (5, 1e-3, "cosine")
    opt = AdamW(mlp().parameters(), lr=s.lr)
    sched = s.scheduler(opt)
    seen = []
    for _ in range(50):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([s(i) for i in range(50)], abs=1e-12)


def test_a_decay_that_ends_before_the_run_holds_min_lr_after():
    """optimizer.decay_steps (GPT-3's decay ends at 260B of its 300B tokens): steps or a fraction of train.steps."""
    for decay in ("80", "0.8"):
        s = Schedule.from_config(C.load("bert-tiny", ["optimizer.warmup_steps=10", "optimizer.schedule=cosine",
                                                    "optimizer.lr=1.0", "optimizer.min_lr=0.1",
                                                    f"optimizer.decay_steps={decay}"]).optimizer, total_steps=100)
        assert [s(10), s(45), s(80), s(90), s(100)] == pytest.approx([1.0, 0.55, 0.1, 0.1, 0.1])
    whole = Schedule.from_config(C.load("bert-tiny", ["optimizer.schedule=cosine", "optimizer.warmup_steps=10"]
                                        ).optimizer, total_steps=100)
    assert whole.total_steps == 100 and whole(99) > whole(100) == 0.0


def test_schedule_kinds_match_the_config():
    assert tuple(optim.schedule.DECAYS) == C.SCHEDULES
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        Schedule(lr=1.0, total_steps=10, kind="step")


@pytest.mark.parametrize("cls", [AdamW, Lamb])
def test_resume_from_state_dict_continues_exactly(cls):
    """Checkpoint resume: 5 steps, state_dict into a fresh optimizer, 5 more == 10 steps straight."""
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)) for _ in range(10)]

    def train(model, opt, steps):
        for x, y in steps:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    straight = mlp()
    train(straight, cls(param_groups(straight, 0.1), lr=1e-2), batches)
    resumed = mlp()
    opt = cls(param_groups(resumed, 0.1), lr=1e-2)
    train(resumed, opt, batches[:5])
    state = opt.state_dict()
    opt = cls(param_groups(resumed, 0.1), lr=1e-2)
    opt.load_state_dict(state)
    train(resumed, opt, batches[5:])
    for p, q in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_auto_follows_the_tensors_the_optimizer_steps_now():
    """multi_tensor=auto picks the multi-tensor path for GPU parameters (FakeTensorMode's CUDA tensors here); once
    DeepSpeed has swapped them for fp32 partitions in CPU memory (ZeRO-Offload), the same optimizer steps one
    parameter at a time, the faster path on a CPU (bench/optimizer_step.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        gpu = nn.ParameterList([torch.empty(4, 4, device="cuda"), torch.empty(4, device="cuda")])
        lamb, adamw = Lamb(param_groups(gpu, 0.1)), AdamW(param_groups(gpu, 0.1))
    assert lamb.foreach and lamb.implementation == "multi-tensor (torch._foreach_*)"
    assert adamw.fused and adamw.foreach
    for opt in (lamb, adamw):
        for group in opt.param_groups:  # what DeepSpeed's offload does to the param groups
            group["params"] = [torch.zeros(sum(p.numel() for p in group["params"]))]
    assert not lamb.foreach and lamb.implementation == "one parameter at a time"
    assert adamw.fused and not adamw.foreach
    assert Lamb(param_groups(mlp(), 0.1), foreach=True).foreach  # a setting stays as set
