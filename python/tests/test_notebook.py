"""A real notebook, executed by nbclient on a real IPython kernel, streams a run to the hub
and shows its live chart: the cell outputs hold the hub's widget markup, whose script the hub
really serves."""

import re
import sys
import urllib.request

import nbformat
import pytest
from nbclient import NotebookClient

import stepstream


def notebook(hub_ws: str, archive: str):
    cells = [
        "import stepstream",
        f"run = stepstream.init(hub={hub_ws!r}, project='nb', name='notebook-run', "
        f"archive_dir={archive!r}, system_metrics=False)\n"
        "for step in range(30):\n"
        "    run.log({'loss': 1.0 / (step + 1), 'lr': 1e-3}, step=step)\n"
        "print(run.run_id)",
        "run.chart('loss', smoothing=0.6)",
        "stepstream.chart(run.run_id, ['loss', 'lr'], hub=run.hub, log=True, theme='dark')",
        "report = run.finish(timeout=30)\nassert report['delivered'], report",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def html_of(cell) -> str:
    for out in cell.outputs:
        if out.get("output_type") == "execute_result" and "text/html" in out.get("data", {}):
            return out["data"]["text/html"]
    raise AssertionError(f"no HTML output in {cell.outputs}")


def test_a_notebook_cell_shows_the_runs_live_chart(hub, tmp_path):
    nb = notebook(hub.url, str(tmp_path))
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    run_id = nb.cells[1].outputs[0]["text"].strip()
    assert hub.run(run_id)["records"] == 30

    http = f"http://127.0.0.1:{hub.port}"
    one = html_of(nb.cells[2])
    assert f'data-stepstream-run="{run_id}"' in one
    assert 'data-metric="loss"' in one and 'data-smoothing="0.6"' in one
    assert f'data-hub="{http}"' in one
    script = re.search(r'<script src="([^"]+)" async></script>', one).group(1)
    assert script == f"{http}/embed.js"
    with urllib.request.urlopen(script, timeout=30) as r:
        assert r.status == 200 and b"stepstream" in r.read()

    two = html_of(nb.cells[3])
    assert 'data-metric="loss,lr"' in two and 'data-log="true"' in two and 'data-theme="dark"' in two
    assert "data-token" not in two, "no token was given: none is written into the notebook"


def test_the_write_token_never_reaches_the_markup_and_bad_options_are_refused(monkeypatch):
    monkeypatch.setenv("STEPSTREAM_WRITE_TOKEN", "secret-writer")
    monkeypatch.setenv("STEPSTREAM_READ_TOKEN", "reader")
    c = stepstream.chart("r1", hub="ws://h:7070")
    assert "secret-writer" not in c._repr_html_() and 'data-token="reader"' in c._repr_html_()
    assert c.iframe_url().startswith("http://h:7070/embed?") and "run=r1" in c.iframe_url()
    evil = stepstream.chart('x" onload="alert(1)', hub="http://h:1")
    assert 'onload="alert' not in evil._repr_html_()
    for bad in ({"smoothing": 1.5}, {"x": "epoch"}, {"theme": "pink"}, {"hub": "ftp://h"}):
        with pytest.raises(ValueError):
            stepstream.chart("r1", **bad)
