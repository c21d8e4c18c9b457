"""Interactive views of relevance for JupyterLab (ipywidgets).

* :class:`RelevanceExplorer`: an image, its relevance overlay, class / method /
  block / head / sign / opacity controls; per-block views show the layer
  product growing and the conserved relevance.
* :class:`ClipExplorer`: the explorer for CLIP, free-text prompts in place of classes.
* :class:`TokenRelevance`: BERT text coloured by token relevance.
* :class:`GenerationExplorer`: each token a language model wrote, explained over its context.
* :class:`MethodGrid`: several methods side by side.
* :class:`ConceptBuilder`: a concept from example images, its CDAM on a query.

All use core ipywidgets controls only (no custom JavaScript) and carry a static
picture in their display data for places where widgets cannot render.
"""
from .clip import ClipExplorer
from .concept import ConceptBuilder
from .explorer import RelevanceExplorer
from .generation import GenerationExplorer
from .grid import MethodGrid
from .text import TokenRelevance

__all__ = ["ClipExplorer", "ConceptBuilder", "GenerationExplorer", "MethodGrid", "RelevanceExplorer", "TokenRelevance"]
