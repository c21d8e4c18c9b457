"""Interactive views of relevance for JupyterLab (ipywidgets).

* :class:`RelevanceExplorer`: an image, its relevance overlay, class / method /
  block / head / sign / opacity controls; per-block views show the layer
  product growing and the conserved relevance.
* :class:`ClipExplorer`: the explorer for CLIP, free-text prompts in place of classes.
* :class:`TokenRelevance`: BERT text coloured by token relevance.
* :class:`SimilarityExplorer`: two sentences and BiLRP's map over their token pairs.
* :class:`GenerationExplorer`: each token a language model wrote, explained over its context.
* :class:`MethodGrid`: several methods side by side.
* :class:`ConceptBuilder`: a concept from example images, its CDAM on a query.

All use core ipywidgets controls only (no custom JavaScript) and carry a static
picture in their display data for places where widgets cannot render.
They need ipywidgets and matplotlib: ``pip install 'transformer-relevance-lab[widgets]'``.
"""

from lrp_core.runtime.extras import require

require("ipywidgets", extra="widgets", what="the widgets package")  # before the views, so the message names the extra

from .clip import ClipExplorer  # noqa: E402
from .concept import ConceptBuilder  # noqa: E402
from .explorer import RelevanceExplorer  # noqa: E402
from .generation import GenerationExplorer  # noqa: E402
from .grid import MethodGrid  # noqa: E402
from .similarity import SimilarityExplorer  # noqa: E402
from .text import TokenRelevance  # noqa: E402

__all__ = [
    "ClipExplorer",
    "ConceptBuilder",
    "GenerationExplorer",
    "MethodGrid",
    "RelevanceExplorer",
    "SimilarityExplorer",
    "TokenRelevance",
]
