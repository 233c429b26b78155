"""The attempt policy of one constrained request: run, validate, renoise from the earliest offending
value, and when the repairs are spent, an AR fallback on the same weights.

Each attempt gets a typed verdict (:class:`Accept` or :class:`Redo`); when no attempt is left the
request ends with the least-junk valid value seen (:class:`LeastJunk`) or a :class:`GiveUp`
carrying the typed error. Where to renoise and what must not come back come from the constraint
(:meth:`Constraint.repair_plan`, :meth:`Constraint.junk_paths`) and
:func:`~dgemma_struct.constraints.json_locate.char_to_token_index`. Every value validation rejected
is banned from the request's later attempts, repairs and AR fallback alike
(:mod:`dgemma_struct.guide.exclusion`), so a repair cannot write it again: each attempt that fails
fails on a new value, and :class:`~dgemma_struct.errors.GenerationFailed` lists each one once.

Example::

    >>> Redo(prefix=[5, 6], reasons=["a: too short"]).prefix
    [5, 6]
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, Sequence, Union

from dgemma_struct.constraints import Constraint, ValidationIssue
from dgemma_struct.errors import DgemmaStructError, GenerationFailed, LengthError, PromptTooLongError
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.engine.token_logprobs import named
from dgemma_struct.constraints.json_locate import Ban, Rejection, char_to_token_index, pointer
from dgemma_struct.guide.exclusion import Exclusion, TokenBytes, dead_end_ban, sharpen
from dgemma_struct.constraints.safety import clip
from dgemma_struct.options import AUTO_BUDGET_CAP, DefaultBudget, GenerateOptions, check_deadline, offset_seed
from dgemma_struct.repair.field_confidence import attach_confidence
from dgemma_struct.results import GenerationResult, GenerationStats

if TYPE_CHECKING:
    from dgemma_struct.runtime import DiffusionRuntime

__all__ = ["Attempt", "Accept", "Redo", "GiveUp", "Verdict", "LeastJunk", "RepairSession", "batch_guide", "min_length_tokens",
           "split_reasoning"]

FORCED_PREFIX_SCAN = 4096   # tokens of a constraint's forced prefix looked at for its minimum length
ATTEMPT_SEED_STRIDE = 1000  # attempt k draws from seed + k * stride


@dataclass
class Attempt:
    tokens: list[int]        # generated tokens, a kept prefix included (stop tokens removed)
    complete: bool           # the grammar accepted and a stop token was reached
    dead_end: bool
    stats: GenerationStats
    logprobs: list | None = None   # with ``logprobs``: one entry per token (a kept prefix keeps its own)


@dataclass(frozen=True)
class Accept:
    """Return this attempt's validated value."""
    attempt: Attempt
    outcome: Any             # the constraint's ValidationOutcome


@dataclass(frozen=True)
class Redo:
    """Run again, keeping ``prefix`` (the tokens before the earliest offending value)."""
    prefix: list[int]
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GiveUp:
    """No valid output: raise ``error``."""
    error: DgemmaStructError


Verdict = Union[Accept, Redo, GiveUp]


@dataclass(frozen=True)
class LeastJunk:
    """The valid attempt with the fewest junk strings so far (a repair must not trade a cleaner
    value for a worse one)."""
    junk: int
    attempt: Attempt
    outcome: Any


def split_reasoning(constraint: Constraint, text: str) -> tuple[str | None, str]:
    """``(thought, answer)`` of decoded text under ``constraint`` (no thought: ``(None, text)``)."""
    return constraint.split_reasoning(text)


def min_length_tokens(constraint: Constraint) -> int:
    """A lower bound on the tokens any accepted output needs: the forced prefix plus EOS."""
    forced = constraint.canvas_walker().forced_tokens(FORCED_PREFIX_SCAN)
    return len(forced) + (0 if forced and forced[-1] in constraint.stop_token_ids else 1)


def shared_prefix_ban(path: tuple, rejected: list[tuple[str, list[str]]]) -> Ban | None:
    """A prefix ban for the strings rejected at ``path`` when two or more were, for the same reasons,
    and they share a start beyond the opening quote (``" "`` and ``" Ito"``: a value starting with a
    space). Banning each value alone did not converge: the model kept its start and changed the rest
    (``handle: no spaces allowed`` three times). None when there is no such start.

    >>> shared_prefix_ban(("h",), [('" "', ["no spaces"]), ('" Ito"', ["no spaces"])])
    Ban(path=('h',), text=b'" ', prefix=True, delimited=False)
    >>> shared_prefix_ban(("h",), [('"ab"', ["x"]), ('"cd"', ["x"])]) is None
    True
    """
    texts = [t for t, _ in rejected]
    if len(texts) < 2 or not all(t.startswith('"') for t in texts) \
            or len({tuple(sorted(m)) for _, m in rejected}) != 1:
        return None
    start = os.path.commonprefix(texts)
    if len(start) < 2 or start in texts:   # nothing beyond the quote, or a whole value (its own ban)
        return None
    return Ban(path, start.encode(), prefix=True, delimited=False)


def batch_guide(sessions: Sequence[RepairSession], walkers: list | None = None, *, budgets: list[int] | None = None,
                row_stop: Sequence[Callable[[], bool] | None] | None = None) -> ConstraintGuide:
    """One guide over the sessions' rows (fresh walkers unless given), with the first session's
    options and deadline (a batch shares them); each row excludes its session's rejected values."""
    first = sessions[0]
    o = first.opts
    return ConstraintGuide(walkers if walkers is not None else [s.c.canvas_walker() for s in sessions],
                           pad_token_id=first.rt.pad_token_id or 0, deadline=first.deadline,
                           budgets=budgets if budgets is not None else [o.max_new_tokens] * len(sessions),
                           row_stop=row_stop, logprobs=o.logprobs, ar_temperature=o.temperature,
                           exclusions=[s.exclusion() for s in sessions], **o.guide_knobs())


class RepairSession:
    """One request: a prompt, its constraint, the options, and the attempts made so far."""

    def __init__(self, runtime: DiffusionRuntime, prompt_ids: list[int], constraint: Constraint,
                 options: GenerateOptions, *, seed: int, deadline: float | None):
        self.rt = runtime
        self.prompt_ids = prompt_ids
        self.c = constraint
        # per-field confidence is read off the recorded token logprobs: a session that asks for it and
        # for no logprobs records them (which draws nothing: the output is the same) and drops them
        self.confidence_only_logprobs = options.confidence and options.logprobs is None
        self.opts = options.with_overrides(logprobs=0) if self.confidence_only_logprobs else options
        self.seed = seed
        self.deadline = deadline
        self.stats = GenerationStats(mode=options.mode, seed=seed)
        self.errors: list[str] = []
        self.least_junk: LeastJunk | None = None
        self.kept_logprobs: list = []   # the entries of the kept prefix of the next attempt
        self.bans: list[Ban] = []       # values no later attempt may write (rejected, or duplicates)
        # each distinct rejected (path, text as written): its messages and how often an attempt wrote it
        self.rejected: dict[tuple[tuple, str], list[str]] = {}
        self.rejected_times: dict[tuple[tuple, str], int] = {}
        self.superfluous_in: set[tuple] = set()   # arrays an attempt wrote a superfluous item or duplicate in

    def exclusion(self) -> Exclusion | None:
        """The rule that keeps this session's rejected values out of its next attempt (None: none yet)."""
        return Exclusion(self.bans, TokenBytes.of(self.c.tokenizer_info)) if self.bans else None

    # -- one pass of the loop from a kept prefix ------------------------------------------------
    def guide_for(self, prefix: list[int]) -> ConstraintGuide:
        """The guide of one attempt from a kept ``prefix``."""
        w = self.c.canvas_walker()
        if prefix:
            w.commit(prefix)
        return batch_guide([self], [w], budgets=[self.opts.max_new_tokens - len(prefix)])

    def absorb(self, res: GenerationResult, guide: ConstraintGuide, row: int = 0) -> Attempt:
        """This session's attempt from ``row`` of ``guide`` (a batched guide shares its mask time)."""
        guide.drain()
        s, agg, out = res.stats, self.stats, guide.outcome(row)
        agg.forward_passes += s.forward_passes
        agg.canvases += s.canvases
        agg.denoising_steps += s.denoising_steps
        agg.model_s += s.model_s
        agg.mask_s += guide.mask_s / len(guide.all_rows)
        agg.forced_tokens += out.forced
        agg.budget_closing = agg.budget_closing or out.closing
        lp = None if out.logprobs is None else self.kept_logprobs + out.logprobs
        return Attempt(tokens=out.tokens, complete=out.complete, dead_end=out.dead_end, stats=s, logprobs=lp)

    def no_room(self, prefix: list[int]) -> Attempt | None:
        """The attempt from ``prefix`` when no token budget is left for one (else ``None``)."""
        if self.opts.max_new_tokens - len(prefix) > 0:
            return None
        return Attempt(prefix, False, False, GenerationStats(), logprobs=list(self.kept_logprobs))

    def attempt_seed(self, attempt: int) -> int:
        """The seed attempt ``attempt`` draws from."""
        return offset_seed(self.seed, ATTEMPT_SEED_STRIDE * attempt)

    def run(self, prefix: list[int], mode: str, attempt: int) -> Attempt:
        """Runs one attempt from ``prefix`` alone."""
        check_deadline(self.deadline)
        guide = self.guide_for(prefix)
        budget = self.opts.max_new_tokens - len(prefix)
        empty = self.no_room(prefix)
        if empty is not None:
            return empty
        seed = self.attempt_seed(attempt)
        res = self.rt.generate_ids([self.prompt_ids + prefix], max_new_tokens=budget, seed=[seed], mode=mode,
                                   hook=guide, temperature=self.opts.temperature, top_p=self.opts.top_p)[0]
        return self.absorb(res, guide)

    def text_of(self, tokens: list[int]) -> str:
        return self.rt.tokenizer.decode(tokens, skip_special_tokens=False)

    # -- validate, repair, fall back -------------------------------------------------------------
    def solve(self, first: Attempt | None = None, t0: float | None = None) -> GenerationResult:
        """Attempt 0, then up to ``max_repairs`` repairs, then the AR fallback. ``first`` is an
        attempt 0 already run (by a batched or streamed loop). Raises the typed error of a
        :class:`GiveUp`."""
        plan = self.attempts(first, t0)
        try:
            ask = next(plan)
            while True:
                ask = plan.send(self.run(*ask))
        except StopIteration as done:
            return done.value

    def attempts(self, first: Attempt | None = None,
                 t0: float | None = None) -> Generator[tuple[list[int], str, int], Attempt, GenerationResult]:
        """:meth:`solve` as a generator for a caller that runs the attempts itself (a batch that
        repairs its rows together): it yields ``(prefix, mode, attempt)``, is sent the
        :class:`Attempt` run for it (:meth:`run` does that), and returns the result (or raises the
        typed error)."""
        t0 = time.perf_counter() if t0 is None else t0
        o = self.opts
        prefix: list[int] = []
        last: Attempt | None = None
        for k in range(o.max_repairs + 1):
            self.stats.repairs = k
            last = first if (k == 0 and first is not None) else (yield prefix, o.mode, k)
            verdict = self.judge(last, k)
            if isinstance(verdict, Accept):
                return self.finish(verdict, t0)
            prefix = verdict.prefix
            self.kept_logprobs = (last.logprobs or [])[:len(prefix)]   # the prefix keeps its entries
        if o.fallback and o.mode == "diffusion":
            self.stats.fallback = True
            last = yield prefix, "ar", o.max_repairs + 1
            verdict = self.judge(last, o.max_repairs)
            if isinstance(verdict, Accept):
                return self.finish(verdict, t0)
        final = self.give_up(last, t0)
        if isinstance(final, Accept):
            return self.finish(final, t0)
        raise final.error

    def judge(self, a: Attempt, attempt: int = 0) -> Accept | Redo:
        """:class:`Accept` the valid attempt with the least junk so far, or :class:`Redo` (the reasons
        recorded). A schema-valid value whose strings hold structural junk (the model's braces
        absorbed into a string) is redone too while repairs remain; after that it is returned, being
        valid. (A greedy AR fallback from the same prefix was measured to rewrite the same junk, so
        junk alone never triggers it.)"""
        if a.dead_end or not a.complete:
            reason = ("the grammar walk made no progress (dead end)" if a.dead_end
                      else "the output did not finish within the token budget")
            self.errors.append(reason)
            if not a.dead_end:
                self._grow_budget()
            if self.bans:   # stopped where the bans left nothing: keep later attempts out
                self._ban_dead_end(a.tokens)
            # dead end or out of budget: keep half of what was generated, renoise the rest
            return self._redo(a.tokens[: len(a.tokens) // 2], [reason])
        outcome = self.c.validate_text(self.text_of(a.tokens))
        if not outcome.ok:
            reasons = [str(e) for e in outcome.errors]
            self.errors.extend(reasons)
            return self._redo(self._prefix_before(a.tokens, outcome.errors, reject=True), reasons)
        value = outcome.value.model_dump(mode="json") if hasattr(outcome.value, "model_dump") else outcome.value
        junk = self.c.junk_paths(value) if self.opts.repair_junk else []
        best = self.least_junk
        if best is None or len(junk) < best.junk:
            self.least_junk = best = LeastJunk(len(junk), a, outcome)
        if junk and attempt < self.opts.max_repairs:
            self.stats.junk_repairs += 1
            issues = [ValidationIssue(p, "structural junk inside a string") for p in junk]
            return self._redo(self._prefix_before(a.tokens, issues), [str(i) for i in issues])
        return Accept(best.attempt, best.outcome)

    def _grow_budget(self) -> None:
        """A default budget the output overran doubles for the next attempts (up to the cap, and
        only while the prompt still fits the context): :class:`~dgemma_struct.options.DefaultBudget`."""
        o = self.opts
        grown = min(2 * o.max_new_tokens, AUTO_BUDGET_CAP)
        if not o.auto_budget or grown <= o.max_new_tokens:
            return
        try:
            self.rt.check_fits([self.prompt_ids], grown)
        except PromptTooLongError:
            return
        self.opts = o.with_overrides(max_new_tokens=DefaultBudget(grown))

    def _redo(self, prefix: list[int], reasons: list[str]) -> Redo:
        """Redo from ``prefix``, cut before a banned value it holds (a ban cut back to where the
        grammar decides can start before the restart point)."""
        ex = self.exclusion()
        return Redo(prefix[:ex.admissible([], prefix)] if ex is not None else prefix, reasons)

    def _prefix_before(self, tokens: list[int], issues: list, *, reject: bool = False) -> list[int]:
        """Tokens before the earliest offending value (where renoising restarts); without a
        located issue, half of them. ``reject``: the issues' values are rejected (recorded, and
        banned from the next attempts; not with a thought block, whose text the ban would misread)."""
        if not issues:
            return tokens[: len(tokens) // 2]
        text = self.text_of(tokens)
        thought, answer = split_reasoning(self.c, text)
        skip = len(text) - len(answer)  # a thought block before the answer is kept as it is
        plan = self.c.repair_plan(answer, issues)
        pieces = [self.rt.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
        if reject:
            index = TokenBytes.of(self.c.tokenizer_info)
            # a second superfluous item (or duplicate) in the same array: the array ends before it (the model
            # repeated an item on every attempt, measured; banning each repeat moved it to the next position)
            closing = [(b, s) for b, s in plan.closing if b.path in self.superfluous_in]
            self.superfluous_in.update(b.path for b, _ in plan.closing)
            bans = [sharpen(b, span and (skip + span[0], skip + span[1]), self.c.canvas_walker(), tokens, pieces,
                            index) for b, span in zip(plan.bans + [b for b, _ in closing],
                                                      plan.spans + [s for _, s in closing])] if thought is None else []
            self._reject(plan.rejected, bans)
        return tokens[:char_to_token_index(pieces, skip + plan.offset)]

    def _ban_dead_end(self, tokens: list[int]) -> None:
        """Bans the value an output stopped in when the bans left it no token (cut back to where the
        grammar forces the rest, as a rejected value's ban is)."""
        text = self.text_of(tokens)
        thought, _ = split_reasoning(self.c, text)
        extra = dead_end_ban(self.bans, text.encode()) if thought is None else None
        if extra is None:
            return
        pieces = [self.rt.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
        span = (len(text) - len(extra.text.decode("utf-8", "ignore")), len(text))
        extra = sharpen(extra, span, self.c.canvas_walker(), tokens, pieces, TokenBytes.of(self.c.tokenizer_info))
        if extra not in self.bans:
            self.bans.append(extra)

    def _reject(self, rejected: list[Rejection], bans: list[Ban]) -> None:
        for r in rejected:
            key = (r.path, r.text)
            msgs = self.rejected.setdefault(key, [])
            if r.message not in msgs:
                msgs.append(r.message)
            self.rejected_times[key] = self.rejected_times.get(key, 0) + 1
        self.bans.extend(b for b in bans if b not in self.bans)
        for r in rejected:
            shared = shared_prefix_ban(r.path, [(t, m) for (p, t), m in self.rejected.items() if p == r.path])
            if shared is not None and shared not in self.bans:
                self.bans.append(shared)

    def rejected_values(self) -> list[dict]:
        """Each distinct rejected value once: ``{"path", "value", "errors", "times"}`` (``path`` a JSON
        Pointer, ``value`` the text as written, ``times`` how many attempts wrote it: 1 unless the
        exclusion could not apply)."""
        return [{"path": pointer(p), "value": text, "errors": list(msgs), "times": self.rejected_times[(p, text)]}
                for (p, text), msgs in self.rejected.items()]

    def give_up(self, last: Attempt | None, t0: float) -> Accept | GiveUp:
        """No attempt left: the least-junk valid value if one was seen, else the typed error."""
        if self.least_junk is not None:  # a valid value (with junk) beat every later attempt
            return Accept(self.least_junk.attempt, self.least_junk.outcome)
        s = self.stats
        s.set_wall(time.perf_counter() - t0)   # a typed error's stats add up as a result's do
        partial = self.text_of(last.tokens) if last else ""
        if last is not None and not last.complete and not last.dead_end:
            s.finish_reason = "length"
            s.generated_tokens = len(last.tokens)
            return GiveUp(LengthError(f"the output could not be completed within max_new_tokens="
                                      f"{self.opts.max_new_tokens}; nothing truncated was returned",
                                      partial_text=partial, stats=s))
        s.finish_reason = "error"
        rejected = self.rejected_values()
        other = [e for e in dict.fromkeys(self.errors) if not any(e.endswith(m) for r in rejected for m in r["errors"])]
        listed = ["{} = {}: {}".format(r["path"] or "<root>", clip(r["value"], 80), "; ".join(r["errors"]))
                  for r in rejected]
        errors = listed + other
        once = ", each tried once" if all(r["times"] == 1 for r in rejected) else ""
        what = f"{len(rejected)} rejected value{'s' if len(rejected) != 1 else ''}{once}: " if rejected else ""
        return GiveUp(GenerationFailed("no valid output after {} repairs{}; {}{}".format(
            self.opts.max_repairs, " and the AR fallback" if s.fallback else "", what, " | ".join(errors)),
            errors=errors, partial_text=partial, stats=s, rejected=rejected))

    def finish(self, verdict: Accept, t0: float) -> GenerationResult:
        a, s = verdict.attempt, self.stats
        s.set_wall(time.perf_counter() - t0)
        s.generated_tokens = len(a.tokens)
        s.tokens_per_forward = (len(a.tokens) + 1) / s.forward_passes if s.forward_passes else 0.0
        s.finish_reason = "stop"
        reasoning, text = split_reasoning(self.c, self.text_of(a.tokens))
        if a.logprobs is not None and [e.token_id for e in a.logprobs] != a.tokens:
            raise RuntimeError("logprob entries do not line up with the output tokens")
        result = GenerationResult(text=text, token_ids=a.tokens, stats=s, value=verdict.outcome.value,
                                  reasoning=reasoning, logprobs=named(a.logprobs, self.rt.tokenizer))
        if self.opts.confidence:
            attach_confidence(result, self.rt.tokenizer, json_output=self.c.schema is not None,
                              drop_logprobs=self.confidence_only_logprobs)
        return result
