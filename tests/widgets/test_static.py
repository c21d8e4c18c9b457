"""Where widgets cannot render (nbconvert, nbval, GitHub), a static picture is shown instead."""

from __future__ import annotations

import base64
import io

import nbformat
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

SETUP = """\
import torch
from timm.models.vision_transformer import VisionTransformer
import widgets
torch.manual_seed(0)
model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                          num_classes=5).eval()
x = torch.randn(1, 3, 32, 32)"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """A notebook with a working and a failing widget, executed headless by nbclient."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell("widgets.RelevanceExplorer(model, x)"),
        nbformat.v4.new_code_cell("widgets.RelevanceExplorer(model, torch.randn(1, 3, 64, 64))"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}}
    ).execute()
    return nb


def _display(cell):
    outs = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
    assert len(outs) == 1, cell.outputs
    return outs[0].data


def test_widget_output_carries_the_view_and_a_png(executed):
    data = _display(executed.cells[1])
    assert "application/vnd.jupyter.widget-view+json" in data
    img = Image.open(io.BytesIO(base64.b64decode(data["image/png"])))
    assert img.size[0] == 320 and img.size[1] > 320


def test_bad_input_is_a_message_not_a_traceback(executed):
    cell = executed.cells[2]
    assert all(o.output_type != "error" for o in cell.outputs)
    html = _display(cell)["text/html"]
    assert "trl-error" in html and "32\u00d732" in html and "Traceback" not in html


def test_html_export_without_widget_state_shows_the_png(executed):
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(executed)
    assert body.count("data:image/png;base64,") >= 1
    assert "trl-error" in body
