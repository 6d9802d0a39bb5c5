"""DraftStepState's lifecycle as a Hypothesis state machine.

Hypothesis calls begin, accumulate, reduce, scale, correct, finish, abort and
retry in any order (and ``advance`` takes a few calls in the right order, so
that whole steps complete between the out-of-order ones). The model next to the state says, for every call, whether
it is allowed in the current phase (and if not, which error must come), and
keeps its own float64 sums, so that:

- a call in the wrong phase raises a clear ``StepOrderError`` or
  ``GradientOrderError`` and changes nothing;
- after ``abort()`` the state is indistinguishable from a fresh one;
- a completed split step leaves the gradients the monolithic step would: draft
  gradients ``raw / d`` (``d``: DP-global weighted draft count), policy
  gradients ``raw / n``, zero (never NaN) when a count is zero;
- a retry of an aborted step equals a clean run of it, bit for bit.

The "other DP ranks" of the count all-reduce are simulated by adding drawn
counts to this rank's payload, as the SUM all-reduce would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from draft_loss.grads import GradientOrderError, scale_gradients, tag_parameter, zero_main_grads
from draft_loss.stats import DraftLossStats
from draft_loss.step_state import DraftStepState, StepOrderError, StepPhase

WEIGHTS = np.array([1.0, 0.5, 2.0])
POOL = 5  # microbatches to draw from; each has fixed statistics and raw gradients


def microbatch(k: int) -> tuple[DraftLossStats, torch.Tensor, torch.Tensor]:
    """Statistics and the raw (policy, draft) gradients of microbatch ``k``.

    Microbatch ``k`` has ``k`` policy tokens (see ``policy_tokens``); microbatch
    0 has no token at all, so counts of zero come up.
    """
    g = torch.Generator().manual_seed(k)
    counts = torch.randint(0, 4, (3,), generator=g).float()
    if k == 0:
        counts.zero_()  # one microbatch without any draft token
    numerators = torch.rand(3, generator=g) * counts
    stats = DraftLossStats(numerators, counts, torch.tensor(WEIGHTS, dtype=torch.float32))
    return stats, torch.randn(4, generator=g), torch.randn(4, generator=g)


def make_params() -> list[torch.nn.Parameter]:
    policy = tag_parameter(torch.nn.Parameter(torch.zeros(4)), "policy", tensor_parallel=False)
    draft = tag_parameter(torch.nn.Parameter(torch.zeros(4)), "draft", tensor_parallel=True)
    return [policy, draft]


def observable(state: DraftStepState) -> tuple:
    """Everything a caller can see of a state (for "equals a fresh one")."""
    try:
        state.metrics()
        metrics = "available"
    except StepOrderError:
        metrics = "refused"
    payload = state.contribute_counts() if state.phase is StepPhase.IDLE else None
    return (
        state.phase,
        state.active,
        state.num_microbatches,
        state.num_bins,
        metrics,
        None if payload is None else payload.numel(),
    )


class DraftStepMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = DraftStepState()
        self.params = make_params()
        zero_main_grads(self.params)
        self.phase = StepPhase.IDLE
        self.mbs: list[int] = []
        self.other = np.zeros(6)  # the other DP ranks' [counts..., numerators...]
        self.policy_count = 0.0
        self.scaled = False

    # ------------------------------------------------------------- helpers

    def local_sums(self) -> np.ndarray:
        counts = sum((microbatch(k)[0].counts.double().numpy() for k in self.mbs), np.zeros(3))
        nums = sum((microbatch(k)[0].numerators.double().numpy() for k in self.mbs), np.zeros(3))
        return np.concatenate([counts, nums])

    def raw_grads(self, which: int) -> tuple[np.ndarray, np.ndarray]:
        """The float64 sum of the microbatches' raw gradients (1: policy, 2: draft), and of their magnitudes."""
        grads = [microbatch(k)[which].double().numpy() for k in self.mbs]
        return sum(grads, np.zeros(4)), sum((np.abs(g) for g in grads), np.zeros(4))

    def refused(self, error: type[Exception], call, *args) -> None:
        before = observable(self.state)
        with pytest.raises(error):
            call(*args)
        assert observable(self.state) == before, "a refused call changed the state"

    # --------------------------------------------------------------- rules

    @rule()
    def begin(self) -> None:
        if self.phase is not StepPhase.IDLE:
            return self.refused(StepOrderError, self.state.begin_step)
        self.state.begin_step()
        zero_main_grads(self.params)
        self.phase, self.mbs, self.scaled = StepPhase.ACCUMULATING, [], False

    @rule(k=st.integers(0, POOL - 1))
    def accumulate(self, k: int) -> None:
        stats, policy_grad, draft_grad = microbatch(k)
        if self.phase is not StepPhase.ACCUMULATING:
            return self.refused(StepOrderError, self.state.accumulate, stats)
        self.state.accumulate(stats)
        # What backward of this microbatch's raw loss adds to the main grads.
        self.params[0].main_grad += policy_grad
        self.params[1].main_grad += draft_grad
        self.mbs.append(k)

    @rule(other_counts=st.lists(st.integers(0, 5), min_size=3, max_size=3), other_policy=st.integers(0, 9))
    def reduce(self, other_counts: list[int], other_policy: int) -> None:
        if self.phase is StepPhase.IDLE:
            payload = self.state.contribute_counts()
            assert payload.numel() == 0  # an inactive state rides along with nothing
            self.state.record_global_counts(payload)
            return self.refused(
                StepOrderError, self.state.record_global_counts, torch.zeros(6, dtype=torch.float64)
            )
        if self.phase is not StepPhase.ACCUMULATING or not self.mbs:
            return self.refused(StepOrderError, self.state.contribute_counts)
        payload = self.state.contribute_counts()
        np.testing.assert_allclose(payload.numpy(), self.local_sums(), rtol=1e-15)
        counts = np.array(other_counts, dtype=np.float64)
        self.other = np.concatenate([counts, counts * 0.25])
        self.state.record_global_counts(payload + torch.from_numpy(self.other))
        self.phase = StepPhase.REDUCED
        self.policy_count = float(sum(self.mbs) + other_policy)  # microbatch k has k policy tokens
        metrics = self.state.metrics()
        global_sums = self.local_sums() + self.other
        d = float(WEIGHTS @ global_sums[:3])
        assert metrics.weighted_count == pytest.approx(d, rel=1e-14)
        expected_loss = float(WEIGHTS @ global_sums[3:]) / d if d > 0 else 0.0
        assert metrics.loss == pytest.approx(expected_loss, rel=1e-12)

    @rule()
    def scale(self) -> None:
        if self.scaled:
            return self.refused(GradientOrderError, scale_gradients, self.params, self.policy_count)
        if self.phase is not StepPhase.REDUCED:
            return  # scaling is the training loop's business; only its order with correct matters
        scale_gradients(self.params, self.policy_count)
        self.scaled = True

    @rule()
    def correct(self) -> None:
        draft_main = getattr(self.params[1], "main_grad", None)
        if self.phase is StepPhase.IDLE:
            if draft_main is not None and bool(draft_main.any()):
                return self.refused(StepOrderError, self.state.correct_main_grads, self.params)
            assert self.state.correct_main_grads(self.params) is None
            return None
        if self.phase in (StepPhase.ACCUMULATING, StepPhase.CORRECTED):
            return self.refused(StepOrderError, self.state.correct_main_grads, self.params)
        if not self.scaled:
            return self.refused(GradientOrderError, self.state.correct_main_grads, self.params)
        self.state.correct_main_grads(self.params)
        self.phase = StepPhase.CORRECTED
        self.check_monolithic_gradients()
        event("a step was corrected")

    def check_monolithic_gradients(self) -> None:
        """The gradients the monolithic step computes: raw / d for the draft, raw / n for the policy."""
        n = self.policy_count
        d = float(WEIGHTS @ (self.local_sums() + self.other)[:3])
        for which, param, denominator in ((1, self.params[0], n), (2, self.params[1], d)):
            raw, magnitude = self.raw_grads(which)
            live = n > 0 and denominator > 0
            expected = raw / denominator if live else np.zeros(4)
            # float32 accumulation: each addition rounds by at most 2**-24 of
            # the running sum (<= the sum of magnitudes); scale and correct add
            # a few roundings more.
            bound = (len(self.mbs) + 4) * 2.0**-24 * magnitude / denominator if live else np.zeros(4)
            got = param.main_grad.double().numpy()
            assert np.isfinite(got).all()
            assert (np.abs(got - expected) <= bound + 1e-300).all(), (which, got, expected, bound)

    @rule()
    def finish(self) -> None:
        if self.phase is not StepPhase.CORRECTED:
            return self.refused(StepOrderError, self.state.finish)
        self.state.finish()
        self.phase, self.mbs = StepPhase.IDLE, []
        event("a step finished")

    @rule()
    def abort(self) -> None:
        self.state.abort()
        assert observable(self.state) == observable(DraftStepState())
        self.phase, self.mbs, self.scaled = StepPhase.IDLE, [], False

    @precondition(lambda self: self.phase is not StepPhase.IDLE and bool(self.mbs))
    @rule(other_policy=st.integers(1, 9))
    def retry(self, other_policy: int) -> None:
        """Abort the step and run it again from the start: same result as on a fresh state."""
        replay = list(self.mbs)
        self.state.abort()
        results = []
        for state in (self.state, DraftStepState()):
            params = make_params()
            zero_main_grads(params)
            state.begin_step()
            for k in replay:
                stats, policy_grad, draft_grad = microbatch(k)
                state.accumulate(stats)
                params[0].main_grad += policy_grad
                params[1].main_grad += draft_grad
            state.record_global_counts(state.contribute_counts() + torch.from_numpy(self.other))
            scale_gradients(params, float(other_policy))
            state.correct_main_grads(params)
            state.finish()
            results.append([p.main_grad.clone() for p in params])
        for retried, clean in zip(*results):
            assert torch.equal(retried, clean)
        event("an aborted step was retried")
        self.phase, self.mbs, self.scaled = StepPhase.IDLE, [], False
        zero_main_grads(self.params)

    @rule(steps=st.integers(1, 8), data=st.data())
    def advance(self, steps: int, data: st.DataObject) -> None:
        """Takes up to ``steps`` calls in the right order, so whole steps get completed
        between the out-of-order calls the other rules make."""
        for _ in range(steps):
            if self.phase is StepPhase.IDLE:
                self.begin()
            elif self.phase is StepPhase.ACCUMULATING:
                if self.mbs and data.draw(st.booleans(), label="reduce now"):
                    self.reduce(
                        data.draw(st.lists(st.integers(0, 5), min_size=3, max_size=3)),
                        data.draw(st.integers(0, 9)),
                    )
                else:
                    self.accumulate(data.draw(st.integers(0, POOL - 1)))
            elif self.phase is StepPhase.REDUCED:
                self.correct() if self.scaled else self.scale()
            else:
                self.finish()

    @invariant()
    def phase_matches_the_model(self) -> None:
        assert self.state.phase is self.phase
        assert self.state.active == (self.phase is not StepPhase.IDLE)
        assert self.state.num_microbatches == (len(self.mbs) if self.phase is not StepPhase.IDLE else 0)


TestDraftStepLifecycle = DraftStepMachine.TestCase


def test_recording_counts_of_a_step_without_microbatches_is_a_clear_error() -> None:
    state = DraftStepState()
    state.begin_step()
    with pytest.raises(StepOrderError, match="no microbatch was accumulated"):
        state.record_global_counts(torch.zeros(0, dtype=torch.float64))
