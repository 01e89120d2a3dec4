"""perf/accuracy_lm.py: the accuracy benchmark's transformer language model and its corpus.

The corpus is a fixed source whose exact loss is known (the forward filter over topics), the
model is causal, and the per-rank gradients are each rank's own micro-batch and average to
the full batch's gradient: the properties the benchmark's deltas rest on."""
import math
import sys

import numpy as np
import pytest

from mpi import REPO

torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "perf"))
import accuracy_lm as lm  # noqa: E402
import accuracy_model as am  # noqa: E402

SHAPE = lm.Shape()


@pytest.fixture(scope="module")
def source():
    return lm.Source(SHAPE)


def test_parameter_count_is_the_documented_one():
    assert sum(p.numel() for p in lm.LM(SHAPE).parameters()) == 42624


def test_corpus_is_fixed_and_independent_of_the_training_seed(source):
    torch.manual_seed(1)
    np.random.seed(1)
    first = source.sample(64, stream=1)
    torch.manual_seed(2)
    np.random.seed(2)
    again = lm.Source(SHAPE).sample(64, stream=1)
    assert torch.equal(first, again)
    assert first.shape == (64, SHAPE.context) and first.dtype == torch.int64
    assert int(first.min()) >= 0 and int(first.max()) < SHAPE.vocab
    assert not torch.equal(first, source.sample(64, stream=2))  # validation is other text


def test_bayes_loss_is_the_sequences_exact_likelihood(source):
    """The forward filter's per-token losses telescope to -log P(x_1..x_T | x_0), the
    sequence's probability under the mixture of topics, computed here directly."""
    tokens = source.sample(50, stream=3)
    x = tokens.numpy()
    # log P_t(x_1..x_T | x_0) per topic, then the uniform mixture over topics
    per_topic = np.log(source.tables[:, x[:, :-1], x[:, 1:]]).sum(axis=2)  # topics x n
    top = per_topic.max(axis=0)
    log_seq = top + np.log(np.exp(per_topic - top).mean(axis=0))
    want = -log_seq.sum() / (x.shape[0] * (x.shape[1] - 1))
    assert source.bayes(tokens) == pytest.approx(want, rel=1e-12)


def test_the_topic_is_worth_learning(source):
    """Bayes < topic-blind bigram < uniform, each by a margin a model can show."""
    tokens = source.sample(512, stream=2)
    bayes, bigram = source.bayes(tokens), source.bigram(tokens)
    assert bayes + 0.5 < bigram < math.log(SHAPE.vocab) - 0.5


def test_model_is_causal():
    """Changing token i changes no logit of positions before i."""
    torch.manual_seed(0)
    model = lm.LM(SHAPE)
    tokens = lm.Source(SHAPE).sample(4, stream=1)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % SHAPE.vocab
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("nranks", [1, 8, 32])
def test_exact_average_of_rank_gradients_is_the_full_batch_gradient(source, nranks):
    tokens = source.sample(32, stream=1)
    torch.manual_seed(0)
    model = lm.LM(SHAPE)
    lm.loss_fn(model(tokens), tokens).backward()
    full = flat_grad(model)
    grads = lm.rank_gradients(model, tokens, nranks)
    assert grads.shape == (nranks, full.numel())
    torch.testing.assert_close(grads.sum(0) / nranks, full, rtol=1e-4, atol=1e-7)


def test_each_rank_gradient_is_its_own_micro_batch(source):
    tokens = source.sample(32, stream=1)
    torch.manual_seed(0)
    model = lm.LM(SHAPE)
    grads = lm.rank_gradients(model, tokens, 8)
    for rank in (0, 5):
        model.zero_grad(set_to_none=True)
        part = tokens[rank * 4:rank * 4 + 4]
        lm.loss_fn(model(part), part).backward()
        torch.testing.assert_close(grads[rank], flat_grad(model), rtol=1e-4, atol=1e-7)


def test_set_grads_writes_the_flat_gradient_in_parameter_order(source):
    model = lm.LM(SHAPE)
    flat = torch.arange(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
    am.set_flat_grads(model, flat)
    assert torch.equal(flat_grad(model), flat)


def test_batch_must_split_evenly(source):
    with pytest.raises(ValueError, match="not a multiple of 8 ranks"):
        lm.rank_gradients(lm.LM(SHAPE), source.sample(12, stream=1), 8)
