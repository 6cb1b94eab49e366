"""A small learned model fitted in a second, without a tuning run: the host candidates of a few
corpus matrices (tuning_helpers' kernels give a real choice), priced by their analytic cost
times a fixed factor per kernel. For the loading, trust and staleness tests."""
import numpy as np

from matplan import corpus, planner
from matplan.core import device as device_mod
from matplan.kernels import kernels_for
from matplan.models import learned
from matplan.models.learned_fit import LearnedCostModel

FAMILIES = ("poisson2d", "uniform", "skewed", "banded")
#: measured / analytic of each kernel: the model learns these corrections
FACTOR = {"test.rowchunk": 3.0, "test.dense": 0.5}


def problem(family="skewed", seed=0):
    A = corpus.load(family, "small", seed=seed)
    return A, np.random.default_rng(seed).random(A.shape[1]) - 0.5


def training_set():
    """(queries, timings) of every registered host candidate on FAMILIES x two seeds."""
    dev = device_mod.current()
    queries, y = [], []
    for family in FAMILIES:
        for seed in (0, 1):
            f = planner.plan(*problem(family, seed), measure="never").features
            for k in kernels_for(f.op, f.backend):
                for params in k.candidates(f, dev):
                    c = k.cost(f, params, dev)
                    queries.append(learned.Query(f, k.name, dict(params), dev, c, k.reads_a_at_run))
                    scale = FACTOR.get(k.name, 1.0) * (1 + 0.1 * seed)
                    y.append([max(c.run_s, 1e-7) * scale, c.prepare_s + 1e-6])
    return queries, np.array(y)


def fit_and_save(folder, name="cpu", **params):
    """A combined model of the host candidates, saved as ``folder/name``; returns its .npz path."""
    queries, y = training_set()
    model = LearnedCostModel(cv=0, max_iter=params.pop("max_iter", 30), **params).fit(queries, y)
    return learned.save(model, name, device_class="cpu", dir=folder)
