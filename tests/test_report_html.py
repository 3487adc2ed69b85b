"""The HTML report: its structure from a real small crash run, aggregation of a huge run, and that the
page fetches nothing. Parsed with the standard library's HTMLParser: no browser."""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from crashbench.model import thresholds
from crashbench.model.faults import SignalRecord
from crashbench.model.ledger import Execution
from crashbench.model.results import Environment, Result
from crashbench.model.spec import Scenario
from crashbench.model.timeline import Depth, DesignFlags, Mark, Spawn, Timeline
from crashbench.report import html, svg
from crashbench.run.session import Options, run_designs


class Page(HTMLParser):
    """Every element as (tag, attributes, index of the run section it is in, -1 outside any)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], int]] = []
        self.sections: list[dict[str, str]] = []
        self.section = -1
        self.text: list[str] = []
        self._cell: dict[str, str] | None = None
        self.cells: dict[tuple[str, str], str] = {}  # (data-run, data-count) -> text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and "run" in a.get("class", "").split():
            self.sections.append(a)
            self.section = len(self.sections) - 1
        self.elements.append((tag, a, self.section))
        if tag == "td" and "data-count" in a:
            self._cell = a

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.section = -1
        if tag == "td":
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            key = (self._cell["data-run"], self._cell["data-count"])
            self.cells[key] = self.cells.get(key, "") + data

    def having(self, *classes: str, section: int | None = None) -> list[dict[str, str]]:
        return [
            a
            for _, a, s in self.elements
            if set(classes) <= set(a.get("class", "").split()) and (section is None or s == section)
        ]


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page


@pytest.fixture(scope="module")
def crash_result(valkey_url: str) -> Result:
    """naive and reliable under 2 mid-job kills, with a threshold naive fails and reliable meets. The
    work lasts 2 s, ten times the kills' span: on a loaded machine a kill comes late, and a queue run dry
    by then leaves its victim idle (a kill that hits no job)."""
    sc = Scenario.of(name="report", jobs=600, job_ms=10, workers=3, kills=2, interval=0.1, stale_after=0.3,
                  recover_every=0.05, drain_timeout=15)  # fmt: skip
    options = Options(redis_url=valkey_url, thresholds=(thresholds.parse("lost == 0"),))
    return run_designs(sc, ["naive", "reliable"], options, kind="compare")


def restarted(tl: Timeline, k: SignalRecord) -> list[str]:
    """The jobs a fault hit that started again afterwards (by anyone)."""
    return [j for j in k.jobs if any(ex.job == j and ex.start > k.at for ex in tl.executions)]


def test_structure_of_a_real_crash_run(crash_result: Result) -> None:
    result = crash_result
    timelines = [r.timeline for r in result.runs]
    assert all(tl is not None for tl in timelines)
    page = parse(html.render(result, timelines))  # type: ignore[arg-type]

    assert [s["data-design"] for s in page.sections] == ["naive", "reliable"]
    for i, run in enumerate(result.runs):
        tl, c = run.timeline, run.counts
        assert tl is not None
        lanes = page.having("lane", section=i)
        assert sorted(int(a["data-slot"]) for a in lanes) == list(range(result.scenario["workers"]))

        kills = page.having("fault", section=i)
        assert c.kills == 2 and len(kills) == c.kills
        assert sorted(a["data-job"] for a in kills) == sorted(k.job or "" for k in run.kills)
        assert len(page.having("fault", "kill", section=i)) == c.kills  # SIGKILL drawn as a kill

        assert c.interrupted > 0 and len(page.having("x", "interrupted", section=i)) == c.interrupted
        completed = sum(1 for ex in tl.executions if ex.completed)
        done, again = page.having("x", "done", section=i), page.having("x", "again", section=i)
        assert len(done) + len(again) == completed

        lines = page.having("recovery", section=i)
        assert len(lines) == sum(len(restarted(tl, k)) for k in run.kills)
        unrecovered = page.having("unrecovered", section=i)
        assert len(unrecovered) == c.unrecovered

        lost = page.cells[(str(i), "lost")].split()
        assert lost[0] == str(c.lost)
        assert ("✗" in lost) == (c.lost > 0)  # the cell of a count whose threshold failed says so

    naive, reliable = result.runs
    # naive gives nothing back: every hit job is lost, marked, and no line leads anywhere.
    assert naive.counts.unrecovered > 0 and naive.counts.lost > 0
    assert {a["data-job"] for a in page.having("unrecovered", section=0)} == set(naive.jobs["lost"])
    assert page.having("recovery", section=0) == []
    # reliable gives each back: one line per hit job, its latency the one tally measured, and its re-run.
    assert reliable.counts.unrecovered == 0 and reliable.counts.lost == 0
    lines = page.having("recovery", section=1)
    assert len(lines) == reliable.counts.kills_mid_job
    hit = [k.recovered_after_ms for k in reliable.kills if k.mid_job]
    assert sorted(float(a["data-ms"]) for a in lines) == sorted(hit)  # type: ignore[type-var]
    assert {a["data-job"] for a in lines} == {k.job for k in reliable.kills}
    # Nothing ran twice, so the re-runs are exactly the hit jobs' completions.
    assert reliable.counts.duplicated == 0
    assert len(page.having("x", "again", section=1)) == len({k.job for k in reliable.kills})
    assert page.having("x", "again", section=0) == []

    # Hovering a bar names the job and the worker: the interrupted ones are the killed workers' jobs.
    text = html.render(result, timelines)  # type: ignore[arg-type]
    hovered = set(re.findall(r'class="x interrupted"[^>]*><title>job (\S+) · (\S+) ·', text))
    assert hovered == {(k.job, k.worker) for run in result.runs for k in run.kills}

    # The threshold: ✗ for naive, ✓ for reliable.
    marks = {(a["class"], a["title"].split(":")[0]) for a in page.having("mark") if a.get("title")}
    assert ("mark fail", "fail") in marks and ("mark pass", "pass") in marks
    body = "".join(page.text)
    assert "✗" in body and "✓" in body


def synthetic(executions: int, slots: int = 8) -> Timeline:
    """A timeline of `executions` 1 ms jobs spread over `slots` workers, one SIGKILL on slot 0."""
    per = executions // slots
    tl = Timeline(
        index=0, spec="reliable", variant="", prefix="x", repeat=0,
        scenario={"name": "big", "workers": slots, "pause": 1.0}, design=DesignFlags(), t0=0.0, started=0.0,
        window=1.0,
    )  # fmt: skip
    tl.spawns = [Spawn(0.0, f"w{s}", s, 100 + s) for s in range(slots)]
    xs = []
    for s in range(slots):
        w = f"w{s}"
        xs.extend(Execution(f"{s}-{n}", w, n * 0.001, n * 0.001 + 0.0009, False, 100 + s, 1) for n in range(per))
    kill_at = per * 0.0005
    hit = xs[per // 2]  # slot 0's job running at kill_at
    xs[per // 2] = Execution(hit.job, "w0", hit.start, None, False, 100, 1)
    xs.append(Execution(hit.job, "w1", kill_at + 1.0, kill_at + 1.0009, False, 101, 1))
    tl.executions = xs
    tl.signals = [SignalRecord(0, kill_at, kill_at, 0, "w0", 100, "SIGKILL", "worker", True, hit.job, 0.0, "w9",
                           jobs=[hit.job])]  # fmt: skip
    tl.spawns.append(Spawn(kill_at + 0.005, "w9", 0, 109))
    tl.depth = [Depth(t, max(0, executions - int(t * 1000 * slots)), slots, 0, 0) for t in range(0, per // 1000 + 1)]
    tl.marks = [Mark(kill_at + 1.0, "recover", 1)]
    tl.drained_at = per * 0.001
    return tl


def bare_result(timelines: list[Timeline]) -> Result:
    env = Environment("0", "3.11", "5", "Linux", "host", 1, "redis", "7", None, "embedded", None, None)
    return Result("id", "run", "now", {"name": "big", "workers": 8}, "fp", [], env)


@pytest.mark.slow
def test_a_huge_run_is_drawn_aggregated_and_stays_small() -> None:
    tl = synthetic(1_000_000)
    started = time.perf_counter()
    text = html.render(bare_result([tl]), [tl])
    elapsed = time.perf_counter() - started
    page = parse(text)
    assert len(page.having("density")) > 0
    assert page.having("x") == []
    assert any("aggregated" in a.get("class", "") for a in page.having("note"))
    assert "aggregated" in "".join(page.text)
    assert len(text.encode()) < 1_000_000
    assert elapsed < 8
    # The fault and its recovery are still drawn one by one.
    assert len(page.having("fault", "kill")) == 1
    assert [float(a["data-ms"]) for a in page.having("recovery")] == [1000.0]


def test_below_the_limit_every_execution_is_a_bar() -> None:
    tl = synthetic(16_000)
    page = parse(html.render(bare_result([tl]), [tl]))
    assert page.having("density") == []
    assert len(page.having("x")) == len(tl.executions)
    assert Counter(a["class"] for a in page.having("x")) == {"x done": 16_000 - 1, "x interrupted": 1, "x again": 1}
    assert "aggregated" not in "".join(page.text)


def test_nothing_is_fetched(tmp_path: Path) -> None:
    tl = synthetic(2_000)
    path = html.write(bare_result([tl]), [tl], tmp_path / "report.html")
    text = path.read_text()
    page = parse(text)
    for tag, a, _ in page.elements:
        for attr in ("src", "href", "xlink:href", "data"):
            assert not re.match(r"\s*(https?:)?//", a.get(attr, "")), (tag, attr, a[attr])
        assert tag not in ("link", "iframe", "img", "object", "embed"), tag
        assert not (tag == "script" and "src" in a)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//|@import", text)


def test_depth_chart_is_a_standalone_svg() -> None:
    a, b = synthetic(2_000), dataclasses.replace(synthetic(2_000), spec="naive")
    text = svg.depth_chart([a, b], width=500, height=120)
    assert text.startswith(f'<svg xmlns="{svg.XMLNS}" width="500" height="120"')
    assert text.count("<path ") == 2  # one line per run
    assert ">reliable<" in text and ">naive<" in text


def test_the_report_names_files_not_the_paths_of_the_machine_that_ran_it(crash_result: Result) -> None:
    """A report is shared: the scenario's file and the server binary by name; the settings that differ
    from the defaults first, the rest folded."""
    result = dataclasses.replace(
        crash_result,
        scenario={**crash_result.scenario, "source": "/home/someone/work/scenarios/mine.toml"},
        environment=dataclasses.replace(crash_result.environment, server_binary="/opt/secret/bin/redis-server"),
    )
    page = html.render(result, [r.timeline for r in result.runs if r.timeline is not None])
    assert "/home/someone" not in page and "/opt/secret" not in page
    assert "<dd>mine.toml</dd>" in page and "<dd>redis-server</dd>" in page
    panel = page[page.index("<h3>Scenario</h3>") :]
    panel = panel[: panel.index("</div>")]
    changed, folded = panel.split("<details>")
    assert "<dt>jobs</dt>" in changed  # the fixture's 200 jobs differ from the default 2,000
    assert "<dt>signal</dt>" in folded and "settings at their defaults" in folded


def test_the_queue_axis_ends_at_the_highest_reading_drawn() -> None:
    """pending (max 10) and in flight (max 4) are drawn each on its own: the axis says 10, not 14."""
    tl = synthetic(20)
    tl.depth = [Depth(0.0, 10, 4, 0, 0), Depth(0.5, 6, 4, 0, 0), Depth(1.0, 0, 0, 0, 0)]
    panel = svg.depth_panel(tl, svg.Scale(0.0, 1.0, 100, 900), 0, 60)
    labels = re.findall(r'class="ylab"[^>]*>([^<]+)<', panel)
    assert labels == ["10", "0"] and "pending (max 10)" in panel and "in flight (max 4)" in panel


def test_the_queue_line_breaks_through_a_broker_outage_instead_of_holding_its_last_reading() -> None:
    """The server was down from 0.4 s to 0.8 s: nobody read the queue then, so nothing is drawn there
    (a held 6 would be made up); the line stops at the fault and starts again at the first reading after."""
    from crashbench.model.faults import BrokerFaultRecord

    tl = synthetic(20)
    tl.depth = [Depth(0.0, 10, 0, 0, 0), Depth(0.25, 6, 0, 0, 0), Depth(0.9, 4, 0, 0, 0), Depth(1.0, 0, 0, 0, 0)]
    tl.broker_fault = BrokerFaultRecord("broker-kill", "none", 0.4, 6, [], 0, back_at=0.8)
    scale = svg.Scale(0.0, 1.0, 100, 900)
    panel = svg.depth_panel(tl, scale, 0, 60)
    areas = re.findall(r'class="depth-area" d="([^"]+)"', panel)
    assert len(areas) == 2
    xs = [[float(x) for x in re.findall(r"[MH](\d+(?:\.\d+)?)", d)] for d in areas]
    assert max(xs[0]) == round(scale.x(0.4)) and min(xs[1]) == round(scale.x(0.9))
    chart = svg.depth_chart([tl], width=500)
    assert re.search(r'<path d="M[^"]*M', chart)  # the standalone chart's line is broken there too
    tl.broker_fault = None
    assert len(re.findall(r'class="depth-area"', svg.depth_panel(tl, scale, 0, 60))) == 1


def test_band_labels_that_would_overlap_are_drawn_once() -> None:
    """A rollout's four SIGTERMs land a few ms apart: four bands (each with its tooltip), one "deploy"
    label above the lanes instead of four written over each other; a band far enough along gets its own."""
    from crashbench.model.timeline import FaultEvent
    from crashbench.report import lanes

    tl = synthetic(400, slots=4)
    ats = [0.0100, 0.0101, 0.0103, 0.0104, 0.040]  # 2 px apart, then 540 px on
    tl.fault_events = [
        FaultEvent("deploy", "sigterm", t, {"worker": f"w{i}", "slot": i % 4}) for i, t in enumerate(ats)
    ]
    scale = svg.Scale(0.0, 0.05, 100, 1000)
    g = lanes.Geometry(top=40, lane_h=16, gap=14, slots=4)
    drawn = "".join(lanes._bands(tl, scale, g))
    assert drawn.count('<g class="band deploy') == 5
    assert drawn.count('class="band-label') == 2  # the first four share one; the one at 40 ms has its own


def test_a_run_without_kills_says_so_and_its_other_faults_are_counted() -> None:
    """The title of a scenario with kills = 0 says "no worker kills" (it said "0 x SIGKILL every 0.5 s"), in
    the page, the terminal table and the exports alike; a run's headline counts every family's faults (a
    host partition's too), not only the kills, the broker's and the network's."""
    from crashbench.faults.hosts import machine
    from crashbench.report import export, tables
    from crashbench.report.rows import kills_phrase

    sc = Scenario.of(name="quiet", kills=0).to_dict()
    assert kills_phrase(sc) == "no worker kills" and "0 ×" not in tables.scenario_line(sc)
    loud = Scenario.of(name="loud", kills=3).to_dict()
    assert kills_phrase(loud) == f"3 × SIGKILL every {loud['interval']:g} s ({loud['kill_when']})"
    partition = {"kind": "host-partition", "host": 0, "at": 0.2, "duration": 0.2}
    sc = Scenario.of(name="hosts", kills=0, jobs=20, job_ms=5, workers=2).replace(
        schedule=({"kind": "hosts", "slots": [[0], [1]]}, partition)
    )
    if (reason := machine.unavailable()) is not None:
        pytest.skip(reason)
    result = run_designs(sc, ["reliable"], Options())
    page = html.render(result, [result.runs[0].timeline])
    assert "no worker kills" in page and "0 × SIGKILL" not in page
    assert re.search(r'<p class="headline">.*· 1 fault</p>', page)
    assert "no worker kills" in export.markdown(result) and "0 × SIGKILL" not in export.markdown(result)
