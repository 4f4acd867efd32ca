"""Evidence runs (modnets.experiments.core.evidence): seeds measured one at a time combine into
the results of one run of those seeds; the plan comes from the pilot by power; a stale or edited
record is caught; the committed records stand."""

import dataclasses
import json

import pytest
from smoke_checks import DATA, missing_data, without_times

from modnets.experiments.core import evidence, evidence_report, renewal
from modnets.experiments.core.claims import seeds_needed
from modnets.experiments.core.discovery import get, list_experiments
from modnets.experiments.core.options import RunOptions
from modnets.reproduce import format_record, main

QUIET = RunOptions(show_progress=False, workers=1, device="cpu")


def _without_provenance(results: dict) -> dict:
    return without_times({k: v for k, v in results.items() if k != "provenance"})


@pytest.mark.parametrize("name", sorted(DATA))
@pytest.mark.long
def test_seeds_measured_alone_combine_into_the_run_of_those_seeds(name):
    """The whole smoke run, then each of its seeds measured alone (its models loaded from the
    run's checkpoints) and combined: the same results, summaries and claims included, but for
    the clock's readings."""
    if missing_data(name):
        pytest.skip(f"the {name} data is not here: {missing_data(name)}")
    experiment = get(name)
    whole = experiment.run(profile="smoke", options=QUIET)
    records = [evidence.measure_seed(experiment, "smoke", s, QUIET) for s in whole["seeds"]]
    combined = evidence.combine(experiment, records)
    assert combined["seeds"] == whole["seeds"]
    assert _without_provenance(combined) == _without_provenance(whole)


@pytest.mark.long
def test_an_evidence_run_plans_by_power_before_its_claim_seeds_then_runs_both_sets(tmp_path):
    """A toy experiment through the whole evidence run: the plan (written before any claim seed
    ran) takes the seeds the pilot's spread asks for; both sets are disjoint from each other and
    from the pilot; every seed has its sealed record; the record decides each claim under both
    sets; a second call measures nothing again."""
    from modnets.training import checkpoint_dir

    toy = get("fuzzy_boolean")
    before = set(checkpoint_dir().glob("*.pt"))
    record = evidence.evidence(toy, "smoke", QUIET, root=tmp_path)
    folder = evidence.record_folder(toy.name, "smoke", tmp_path)
    # the run trains into checkpoints of its own: never a book build's model, nor one for it
    assert set(checkpoint_dir().glob("*.pt")) == before
    assert list((checkpoint_dir() / "evidence").glob(f"{toy.name}*.pt"))
    plan = record.plan
    assert json.loads((folder / "plan.json").read_text())["n"] == plan.n
    assert evidence.MIN_SEEDS <= plan.n <= evidence.CAP
    # the plan is what the pilot's records ask for, written before any claim seed
    pilots = [json.loads((folder / f"seed-{s}.json").read_text()) for s in plan.pilot_seeds]
    assert evidence.plan_from_pilot(evidence.combine(toy, pilots)).n == plan.n
    written = (folder / "plan.json").stat().st_mtime_ns
    assert all(
        (folder / f"seed-{s}.json").stat().st_mtime_ns > written
        for name in evidence.SETS
        for s in plan.seeds[name]
    )
    assert plan.seeds["claim"] == list(range(plan.n))
    seeds = [*plan.pilot_seeds, *plan.seeds["claim"], *plan.seeds["replication"]]
    assert len(set(seeds)) == len(seeds)
    assert sorted(p.name for p in folder.glob("seed-*.json")) == sorted(
        f"seed-{s}.json" for s in seeds
    )
    found = evidence.agreements([record], "NI")
    assert record.complete and {a.id for a in found} == set(toy.rules)
    for name in evidence.SETS:
        assert record.results[name]["seeds"] == plan.seeds[name]
    mtimes = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = evidence.evidence(toy, "smoke", QUIET, root=tmp_path)
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    assert evidence.agreements([again], "NI") == found
    assert "n = " in format_record(again)
    assert renewal.problems([toy], tmp_path) == []

    # an edited number breaks the seal; a record from other code is stale: both named, with the
    # command that renews them
    path = folder / f"seed-{plan.seeds['claim'][0]}.json"
    data = json.loads(path.read_text())
    data["models"]["pretrain"]["per_seed"][0]["mean_r2"] += 0.01
    path.write_text(json.dumps(data))
    other = folder / f"seed-{plan.seeds['replication'][0]}.json"
    data = json.loads(other.read_text())
    data["provenance"]["code_fingerprint"] = "0" * 16
    data["seal"] = evidence.seal(data)
    other.write_text(json.dumps(data))
    plan_file = folder / "plan.json"
    plan_text = plan_file.read_text()
    edited_plan = {**json.loads(plan_text), "pilot_seeds": [900, 901]}  # edited after the fact
    plan_file.write_text(json.dumps(edited_plan))
    found = renewal.problems([toy], tmp_path)
    assert [p.path for p in found] == [plan_file, path, other]  # the plan, then by file name
    assert all("--renew" in p.command and p.command in str(p) for p in found)
    assert "seal" in found[0].reason and "seal" in found[1].reason
    assert "training code" in found[2].reason and "stale" in found[2].reason
    assert renewal.problems([toy], tmp_path, profile="cpu") == []  # another profile's folder
    plan_file.write_text(plan_text)
    with pytest.raises(ValueError, match="seal"):
        evidence.load_record(toy, "smoke", tmp_path)
    main(["--profile", "smoke", "--experiments", toy.name, "--records", str(tmp_path), "--renew"])
    assert renewal.problems([toy], tmp_path) == []
    # the edited record was measured again; the stale one, measured again as the witness, gave
    # what it says: it is stamped with the code as it is, the old fingerprint kept
    rep = plan.seeds["replication"]
    (renewed,) = json.loads(other.read_text())["provenance"]["renewed"]
    assert renewed["code_fingerprint"] == "0" * 16 and renewed["witness"] == rep[0]
    before = evidence.load_record(toy, "smoke", tmp_path)

    # stale records whose witness measures otherwise: its new record replaces its old one, and
    # the other stale records are measured again
    for s in rep[:2]:
        f = folder / f"seed-{s}.json"
        data = json.loads(f.read_text())
        data["provenance"]["code_fingerprint"] = "1" * 16
        if s == rep[0]:
            data["models"]["pretrain"]["per_seed"][0]["mean_r2"] += 0.01
        data["seal"] = evidence.seal(data)
        f.write_text(json.dumps(data))
    done = renewal.renew(toy, "smoke", QUIET, root=tmp_path)
    assert (done.witness, done.equal, done.stamped, done.removed) == (rep[0], False, [], [rep[1]])
    assert not (folder / f"seed-{rep[1]}.json").exists()
    after = evidence.evidence(toy, "smoke", QUIET, root=tmp_path)
    for name in evidence.SETS:
        assert _without_provenance(after.results[name]) == _without_provenance(before.results[name])
    assert renewal.problems([toy], tmp_path) == []

    # the profile's settings changed (here how many routing points are summarised): every record
    # is stale, the setting named; a setting the sweep chooses may differ from the profile's
    smoke = toy.configs["smoke"]
    replace = dataclasses.replace
    changed = replace(smoke, routing_points=smoke.routing_points + 1)
    moved = replace(toy, configs={**toy.configs, "smoke": changed})
    found = renewal.problems([moved], tmp_path)
    assert len(found) == len(list(folder.glob("seed-*.json")))
    assert all(p.stale and "routing_points" in p.reason and "--renew" in str(p) for p in found)
    other_train = replace(smoke.train, finetune_lrs=(*smoke.train.finetune_lrs, 1e-4))
    swept = replace(toy, configs={**toy.configs, "smoke": replace(smoke, train=other_train)})
    assert renewal.problems([swept], tmp_path) == []
    # ... but a training setting the sweep does not choose may not
    more = replace(smoke.train, points_per_function=smoke.train.points_per_function + 1)
    unswept = replace(toy, configs={**toy.configs, "smoke": replace(smoke, train=more)})
    found = renewal.problems([unswept], tmp_path)
    assert found and all(p.stale and "train" in p.reason for p in found)

    # a chapter shows the complete record's claim seeds and trains the first again, checked
    book = evidence_report.book_results(toy, "smoke", QUIET, root=tmp_path)
    assert book.recorded and book.results["seeds"] == plan.seeds["claim"]
    assert book.build["seeds"] == plan.seeds["claim"][:1]
    assert book.checks and all(c.within and c.seed == 0 for c in book.checks)
    assert "results of the evidence record" in book.sentence()

    assert evidence_report.RECORD_MISMATCH not in book.sentence()
    bare = evidence_report.book_results(toy, "smoke", QUIET, root=tmp_path / "none")
    assert not bare.recorded and bare.results is bare.build and not bare.checks
    assert bare.sentence().startswith("No complete evidence record")


def test_a_pilot_outside_its_regime_declares_no_plan(tmp_path, monkeypatch):
    # at a profile that decides, a pilot that misses the regime stops the run before the plan:
    # its claim seeds would test nothing
    toy = get("fuzzy_boolean")
    monkeypatch.setattr(evidence, "GATED_PROFILES", ("smoke",))

    def missed(results):
        return {**toy.regime(results), "reached": False, "shortfall": "a bar missed"}

    gated = dataclasses.replace(toy, regime=missed)
    with pytest.raises(evidence.PilotOutsideRegime, match="a bar missed"):
        evidence.evidence(gated, "smoke", QUIET, root=tmp_path)
    folder = evidence.record_folder(toy.name, "smoke", tmp_path)
    assert not (folder / "plan.json").exists()
    pilots = sorted(p.name for p in folder.glob("seed-*.json"))
    assert pilots == sorted(f"seed-{s}.json" for s in evidence.PILOT_SEEDS)


def test_an_experiment_that_trains_its_seeds_together_gets_them_a_group_at_a_time(
    tmp_path, monkeypatch
):
    """Where an experiment declares ``train_seeds``, the evidence run hands it as many seeds of
    a set as there are workers (in the run's own checkpoints, with the workers resolved), then
    measures and records them one by one before the next group trains: a run cut short keeps
    every group it finished. With one worker, or one seed left, it measures at once."""
    from modnets.training import checkpoint_dir

    calls, measured = [], []
    folder = tmp_path / "records"
    folder.mkdir()

    def train_seeds(config, options):
        recorded = sorted(int(p.stem.split("-")[1]) for p in folder.glob("seed-*.json"))
        calls.append((config.seeds, options.workers, checkpoint_dir().name, recorded))

    def measure_seed(experiment, profile, seed, options):
        measured.append(seed)
        return {"seed": seed, "provenance": {}}

    monkeypatch.setattr(evidence, "measure_seed", measure_seed)
    toy = dataclasses.replace(get("fuzzy_boolean"), train_seeds=train_seeds)
    two = dataclasses.replace(QUIET, workers=2)
    evidence._ensure(toy, "smoke", [5, 6, 7, 8, 9], folder=folder, options=two, desc="claim")
    assert calls == [((5, 6), 2, "evidence", []), ((7, 8), 2, "evidence", [5, 6])]
    assert measured == [5, 6, 7, 8, 9]
    # each record carries its share of the time its group trained side by side
    written = evidence.read_seed(evidence.seed_path(folder, 6))
    assert written["provenance"]["trained_ahead_seconds"] >= 0.0
    evidence.seed_path(folder, 6).unlink()
    evidence._ensure(toy, "smoke", [5, 6, 7], folder=folder, options=two, desc="claim")
    evidence.seed_path(folder, 6).unlink()
    evidence.seed_path(folder, 7).unlink()
    evidence._ensure(toy, "smoke", [5, 6, 7], folder=folder, options=QUIET, desc="claim")
    assert len(calls) == 2 and measured == [5, 6, 7, 8, 9, 6, 6, 7]
    # an experiment that trains no seeds together is measured one seed at a time, each once
    for seed in (5, 6, 7):
        evidence.seed_path(folder, seed).unlink()
    plain = dataclasses.replace(toy, train_seeds=None)
    evidence._ensure(plain, "smoke", [5, 6, 7], folder=folder, options=two, desc="claim")
    assert len(calls) == 2 and measured[-3:] == [5, 6, 7] and len(measured) == 11


def test_the_plan_takes_the_seeds_the_pilots_spread_asks_for_within_its_bounds():
    """n is the largest number of seeds a paper claim needs at the pilot's spread, at least
    MIN_SEEDS, at most CAP; a claim needing more is recorded as such, not counted."""
    rule = get("fuzzy_boolean").rules["table1-type-beats-cls"]
    effect = rule.paper_effect - rule.threshold

    def pilot(sd):
        values = [effect - sd, effect, effect + sd]
        claim = {"id": rule.id, "kind": "paper", "test": ">", "values": values}
        return {
            "experiment": "fuzzy_boolean",
            "profile": "cpu",
            "seeds": [900, 901, 902],
            "claims": [claim],
            "provenance": {"code_fingerprint": ["abc"]},
        }

    assert evidence.plan_from_pilot(pilot(effect / 100)).n == evidence.MIN_SEEDS
    needs = seeds_needed(effect, effect / 2)
    assert evidence.MIN_SEEDS < needs <= evidence.CAP
    assert evidence.plan_from_pilot(pilot(effect / 2)).n == needs
    plan = evidence.plan_from_pilot(pilot(effect * 3))
    assert plan.n == evidence.MIN_SEEDS and plan.needed[rule.id] > evidence.CAP
    n = plan.n
    with pytest.raises(ValueError, match="share"):
        dataclasses.replace(
            plan, seeds={"claim": list(range(n)), "replication": [*range(1, n), 99]}
        )
    with pytest.raises(ValueError, match="distinct"):
        dataclasses.replace(plan, seeds={"claim": [0] * n, "replication": list(range(10, 10 + n))})
    with pytest.raises(ValueError, match="n must be"):
        dataclasses.replace(plan, n=13)


def _record(values: dict[str, list[float]], replication: dict | None = None, needed=None):
    """A made-up complete record of claims ``{id: values over the claim seeds}``."""
    from modnets.experiments.core.claims import decide_rule

    rules = get("fuzzy_boolean").rules
    n = len(next(iter(values.values())))
    seeds = {"claim": list(range(n)), "replication": list(range(1000, 1000 + n))}
    plan = evidence.Plan(
        experiment="fuzzy_boolean",
        profile="cpu",
        pilot_seeds=[900],
        needed=needed or {},
        n=n,
        cap=12,
        seeds=seeds,
        code="",
        declared="",
    )
    sets = {"claim": values, "replication": replication or values}
    results = {
        k: {
            "claims": [decide_rule(i, v, rules=rules).as_dict() for i, v in c.items()],
            "provenance": {"cpu": ["a made-up CPU"], "torch": ["2.13.0"], "wall_seconds": 900.0},
        }
        for k, c in sets.items()
    }
    return evidence.Record(plan, results, {"claim": [], "replication": []})


def test_a_claim_is_decided_only_where_both_seed_sets_agree():
    """Both sets reproduce: decided. One reproduces, the other not: undecided, saying so. A claim
    needing more seeds than the cap: undecided, saying so, whatever the sets gave."""
    up, down = [0.05, 0.06, 0.07, 0.055], [-0.05, -0.06, -0.07, -0.055]
    cid = "table1-type-beats-cls"
    (a,) = evidence.agreements([_record({cid: up})], "NI")
    assert a.decided == "reproduced" and not a.note
    (b,) = evidence.agreements([_record({cid: up}, {cid: down})], "NI")
    assert b.verdicts == {"claim": "reproduced", "replication": "not reproduced"}
    assert b.decided == "undecided" and "disagree" in b.note
    (c,) = evidence.agreements([_record({cid: up}, needed={cid: 40})], "NI")
    assert (
        c.decided == "undecided" and c.note == "needs 40 seeds at the pilot's spread, more than 12"
    )
    (e,) = evidence.agreements([_record({cid: up}, needed={cid: None})], "NI")
    assert e.decided == "undecided" and e.note.startswith("the pilot gave no number")
    # not testable on both sets (its mechanism unused, say): more seeds would not change that
    from modnets.experiments.core.claims import untestable

    record = _record({cid: up}, needed={cid: 40})
    for name in evidence.SETS:
        unused = untestable(cid, "the types unused", rules=get("fuzzy_boolean").rules)
        record.results[name]["claims"] = [unused.as_dict()]
    (g,) = evidence.agreements([record], "NI")
    assert g.decided == "not testable here" and not g.note
    assert not a.smaller  # 0.06 against the paper's 0.0655: consistent
    small = [0.01, 0.012, 0.011, 0.013]
    sentence = evidence_report.evidence_sentence({"fuzzy_boolean": _record({cid: up}, {cid: down})})
    assert (
        "is open, reproduced on the claim seeds and not reproduced on the replication" in sentence
    )
    (d,) = evidence.agreements([_record({cid: small})], "NI")
    assert d.decided == "reproduced" and d.smaller
    sentence = evidence_report.evidence_sentence({"fuzzy_boolean": _record({cid: small})})
    assert f"Both reproduce the direction of `{cid}` (" in sentence
    assert "with an effect smaller than the paper's (both intervals stop short of it)" in sentence
    # an inconclusive claim says why: smaller than the paper's (its intervals exclude it), or
    # underpowered (they hold both the paper's effect and the threshold)
    below = [0.001, -0.002, 0.0, 0.002]  # around 0, far below the paper's 0.0655
    wide = [-0.05, 0.15, 0.0, 0.12]  # around the paper's effect, wide
    for values, why in ((below, "with an effect smaller than the paper's"), (wide, "underpowered")):
        (f,) = evidence.agreements([_record({cid: values})], "NI")
        assert f.decided == "inconclusive"
        sentence = evidence_report.evidence_sentence({"fuzzy_boolean": _record({cid: values})})
        assert f"Both leave `{cid}` (" in sentence and f"inconclusive {why}" in sentence.replace(
            "inconclusive,", "inconclusive"
        )


def test_the_build_check_flags_a_seed_outside_the_records_range():
    """The build's check: a recomputed per-seed value inside the claim set's range widened by
    its spread passes; one far outside it does not; seeds that are not claim seeds are not
    checked."""
    cid = "table1-type-beats-cls"
    record = _record({cid: [0.01, 0.02, 0.03, 0.02]})
    build = {"seeds": [0, 1, 77], "claims": [{"id": cid, "values": [0.035, 0.5, 0.0]}]}
    checks = evidence_report.check_against_record(record, build)
    assert [(c.seed, c.within) for c in checks] == [(0, True), (1, False)]
    with pytest.raises(ValueError, match="none of the seeds"):
        evidence_report.check_against_record(record, {"seeds": [77], "claims": []})


def test_the_committed_records_stand():
    """Every committed seed record is sealed and made with the code as it is now: a stale or
    edited record fails here, naming the command that renews it."""
    found = renewal.problems([get(n) for n in list_experiments()])
    assert not found, "\n".join(map(str, found))


def test_chapter_13_shows_a_seed_outside_its_record_in_words_the_audit_fails_on(
    tmp_path, monkeypatch
):
    """report.record_checks reads the build's results against the records; a value outside
    the record's range is said with the words book_audit flags."""
    import book_audit

    from modnets.experiments.core import evidence_report as report
    from modnets.experiments.core import results

    cid = "table1-type-beats-cls"
    records = {"fuzzy_boolean": _record({cid: [0.01, 0.02, 0.03, 0.02]}), "digits": None}
    build = {"seeds": [0, 1], "claims": [{"id": cid, "values": [0.02, 0.5]}]}
    (tmp_path / "fuzzy_boolean_build_cpu.json").write_text("{}")  # the seeds trained again
    monkeypatch.setattr(results, "load_results", lambda path: build)
    frame, sentence = report.record_checks(records, "cpu", tmp_path)
    assert list(frame["check"]) == ["within", report.RECORD_MISMATCH]
    assert sentence.startswith("1 of the 2") and report.RECORD_MISMATCH in sentence
    assert book_audit.RECORD_MISMATCH == report.RECORD_MISMATCH
    page = (
        '<html><body><article><div class="cell_output docutils container"><div class="output '
        f'text_html"><p>{sentence}</p></div></div></article></body></html>'
    )
    assert any(p.startswith("record_mismatch") for p in book_audit.audit_page(page))
    status = report.evidence_status(records, "cpu")
    assert "`digits`: no evidence record yet" in status and "4 seeds a set" in status
    assert "the two sets in 0.5 h of machine time" in status  # 2 x 900 s
    assert list(report.evidence_frame(records)["decided"]) == ["reproduced"]
    sentence = report.evidence_sentence(records)
    assert sentence.startswith("**Neural Interpreters** (`fuzzy_boolean`: 4 seeds a set).")
    assert "reproduce the direction of `table1-type-beats-cls` (claim seeds " in sentence
    assert "; the paper's 0.066)" in sentence  # the numbers inline, the paper's beside them
    none = report.evidence_sentence({"digits": None})
    assert none.startswith("**Neural Interpreters**: no evidence record of `fuzzy_boolean`")


def test_a_chapter_takes_holm_over_its_papers_claims_in_every_complete_record(tmp_path):
    """The claim set a chapter shows gets Holm's correction over its paper's claims (chapter
    13's family): two claims each passing alone at p ≈ 0.03 do not both pass as a family."""
    a, b = "table1-type-beats-cls", "table1-gap-closed"
    values = [0.02, 0.03, 0.05, 0.07]  # t ≈ 3.8 on 3 degrees of freedom: p ≈ 0.03
    record = _record({a: values, b: values})
    results = evidence_report._holm_over_paper(get("fuzzy_boolean"), record, "cpu", tmp_path)
    assert [c["verdict"] for c in results["claims"]] == ["reproduced"] * 2
    assert [c["verdict_holm"] for c in results["claims"]] == ["inconclusive"] * 2
    assert {c["holm_family"] for c in results["claims"]} == {"Neural Interpreters"}


def test_the_measurement_fingerprint_follows_the_code_not_its_words(tmp_path):
    """Rewording a docstring keeps a record fresh; changing what the code does makes it stale."""
    import importlib
    import sys

    from modnets.experiments.core.fingerprints import logic_fingerprint

    code = 'def helper(x):\n    """{doc}"""\n    return x + {k}\n\n\ndef measure(x):\n    return helper(x)\n'

    def fingerprint(folder: str, doc: str, k: int) -> str:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "toy_measure.py").write_text(code.format(doc=doc, k=k))
        sys.path.insert(0, str(tmp_path / folder))
        try:
            return logic_fingerprint(importlib.import_module("toy_measure").measure)
        finally:
            sys.path.remove(str(tmp_path / folder))
            sys.modules.pop("toy_measure")

    base = fingerprint("a", "adds one", 1)
    assert fingerprint("b", "adds 1 to x", 1) == base  # the words changed
    assert fingerprint("c", "adds one", 2) != base  # what it does changed


def test_a_papers_other_complete_records_are_found_and_no_others(tmp_path):
    """The records a paper's Holm family pools: the complete ones of the paper's other
    experiments (the committed fuzzy Booleans record, copied here), not its own nor another
    paper's."""
    import shutil

    shutil.copytree(evidence.record_folder("fuzzy_boolean", "cpu"), tmp_path / "cpu/fuzzy_boolean")
    found = evidence_report.paper_records(get("digits"), "cpu", tmp_path)
    assert [r.plan.experiment for r in found] == ["fuzzy_boolean"]
    assert evidence_report.paper_records(get("fuzzy_boolean"), "cpu", tmp_path) == []
    assert evidence_report.paper_records(get("tiny_imagenet"), "cpu", tmp_path) == []


def test_a_witness_counts_only_when_equal_to_its_record_bit_for_bit():
    """Renewal's comparison: the clock's readings aside, every value equal; a number one float32
    ulp apart, or any other value changed, is another measurement."""
    from modnets.experiments.core.renewal import same_measurement

    record = {
        "config": {"epochs": 3},
        "selection_seeds": [100],
        "models": {"all": {"per_seed": [{"mean_r2": 0.9627459645271301, "seconds": 4.0}]}},
        "diagnostics": {"shift": [0.005804862827062607, float("nan")]},
    }

    def changed(key, value):
        out = json.loads(json.dumps(record))
        out["models"]["all"]["per_seed"][0][key] = value
        return out

    assert same_measurement(record, json.loads(json.dumps(record)))
    assert same_measurement(record, changed("seconds", 5.5))  # the clock's reading
    assert not same_measurement(record, changed("mean_r2", 0.9627460241317749))  # one ulp
    other = json.loads(json.dumps(record))
    other["selection_seeds"] = [101]
    assert not same_measurement(record, other)
