"""Exercises of notebook 14, "Explaining a vision-language model": the reference computations and their checkers."""
from __future__ import annotations

import torch

from lrp_core import Contrast, explain

from .exercise import Exercise, Mistake

#: the held-out questions of the notebook and the one it explains
RECORDS_SEED_OFFSET = 14
RECORD_INDEX = 1


def context():
    """The notebook's objects (for the tests), built as the notebook builds them."""
    from lrp_core.data import make_vqa
    from lrp_core.models import load
    from lrp_core.models.tiny_vlm import HELD_OUT_SEED

    records = make_vqa(24, seed=HELD_OUT_SEED + RECORDS_SEED_OFFSET)
    return {"vlm": load("tiny-vlm"), "records": records, "record": records[RECORD_INDEX]}


def _answer_map(vlm, record, target=None) -> torch.Tensor:
    """(H, W) the AttnLRP image map of ``record``'s answer (or of ``target``), upsampled to the image."""
    inputs = vlm.preprocess(record.image, record.question)
    if target is None:
        target = vlm.tokenizer.convert_tokens_to_ids(record.answer)
    return explain(vlm.model, inputs, method="attnlrp", target=target).upsample()[0]


def _pixel_map(vlm, record) -> torch.Tensor:
    """(H, W) ``exp.pixels`` of the answer: the near miss of 14.1 (the pixel relevance, not the patch map)."""
    inputs = vlm.preprocess(record.image, record.question)
    target = vlm.tokenizer.convert_tokens_to_ids(record.answer)
    return explain(vlm.model, inputs, method="attnlrp", target=target).pixels[0]


def _share(image_map: torch.Tensor, mask, part: str = "positive") -> float:
    m = torch.as_tensor(mask)
    v = image_map.double()
    v = {"positive": v.clamp(min=0), "signed": v, "absolute": v.abs()}[part]
    return float(v[m].sum() / v.sum())


# ---------------------------------------------------------------- 14.1
def answer_mask_share(vlm, record) -> float:
    image_map = _answer_map(vlm, record)
    share = _share(image_map, record.mask)
    print(f"AttnLRP, answer {record.answer!r}: {share:.1%} of the positive image relevance lies on the deciding "
          f"object ({record.mask.mean():.1%} of the image)")
    return share


def _other_mask(record):
    """The mask of the scene's object that does not decide the answer."""
    same = [bool((m == record.mask).all()) for m in record.masks]
    return record.masks[same.index(False)]


ex14_1 = Exercise(
    "ex14_1", "How much of the image map lies on the deciding object?", answer_mask_share, difficulty=1,
    minutes=10, needs=("vlm", "record"),
    answer="a float in [0, 1]: for `record`, the positive AttnLRP relevance of the answer's image map "
           "(upsampled to 112 x 112) inside record.mask, divided by all positive relevance of the map",
    hints=["inputs = vlm.preprocess(record.image, record.question); the target is "
           "vlm.tokenizer.convert_tokens_to_ids(record.answer).",
           "explain(vlm.model, inputs, method='attnlrp', target=...).upsample()[0] is the (112, 112) image map; "
           "torch.as_tensor(record.mask) is the deciding object's pixels.",
           "Keep the positive part (clamp(min=0)) of the map; the share is its sum inside the mask over its total."],
    mistakes=[Mistake(lambda vlm, record: _share(_answer_map(vlm, record), record.mask, "signed"),
                      "that divides signed sums: keep the positive relevance only, clamp(min=0) before both sums"),
              Mistake(lambda vlm, record: _share(_answer_map(vlm, record), record.mask, "absolute"),
                      "that counts negative relevance as evidence (absolute values): use clamp(min=0)"),
              Mistake(lambda vlm, record: _share(_answer_map(vlm, record), _other_mask(record)),
                      "that is the other object's mask: record.mask is the deciding object's"),
              Mistake(lambda vlm, record: _share(_pixel_map(vlm, record), record.mask),
                      "that is exp.pixels, the relevance of the input pixels (what reaches the image through the "
                      "vision tower's patch projection); the exercise asks for the patch map upsampled to the "
                      "image: exp.upsample()[0]"),
              Mistake(lambda vlm, record: 100 * answer_mask_share(vlm, record),
                      "that is a percentage: hand in the share as a fraction in [0, 1]")],
    atol=1e-6, rtol=1e-4,
    discussion="The deciding object covers a few percent of the image but holds a large share of the positive "
               "relevance: the language model reads the answer from the image tokens over that object. The "
               "evidence table of section 5 is this number averaged over held-out questions "
               "(lrp_core.evaluation.vlm.mask_share computes it).",
)


# ---------------------------------------------------------------- 14.2
def _other_shape(record) -> str:
    """The shape of the scene's object that is not the answer (record is a question answered by a shape)."""
    return next(s for s in record.shapes if s != record.answer)


def _contrast_map(vlm, record, reverse: bool = False) -> torch.Tensor:
    ids = vlm.tokenizer.convert_tokens_to_ids([record.answer, _other_shape(record)])
    return _answer_map(vlm, record, Contrast(ids[1], ids[0]) if reverse else Contrast(ids[0], ids[1]))


def contrast_mask_share(vlm, record) -> float:
    share = _share(_contrast_map(vlm, record), record.mask)
    print(f"AttnLRP, {record.answer!r} rather than {_other_shape(record)!r}: {share:.1%} of the positive image "
          "relevance lies on the deciding object")
    return share


ex14_2 = Exercise(
    "ex14_2", "Rather than the other shape", contrast_mask_share, difficulty=2, minutes=10,
    needs=("vlm", "record"),
    answer="a float in [0, 1]: the mask share (as in 14.1) of the AttnLRP image map of the answer *rather than* "
           "the shape of the scene's other object",
    hints=["The other shape is the one of record.shapes that is not record.answer; its token id comes from "
           "vlm.tokenizer.convert_tokens_to_ids.",
           "target=Contrast(answer_id, other_id) explains y_answer − y_other.",
           "Upsample the contrast's map and take its positive share inside record.mask, as in 14.1."],
    mistakes=[Mistake(lambda vlm, record: _share(_answer_map(vlm, record), record.mask),
                      "that is the plain map of the answer: use target=Contrast(answer, other)"),
              Mistake(lambda vlm, record: _share(_contrast_map(vlm, record, reverse=True), record.mask),
                      "the contrast is the other way round: Contrast(answer, other) is 'the answer rather than the "
                      "other shape'")],
    atol=1e-6, rtol=1e-4,
    discussion="The contrast removes what speaks for both shapes alike: on the notebook's question the other "
               "object's patches, faintly positive in the plain map, turn negative, and the share on the deciding "
               "object rises a little (about 50 % plain, 54 % as a contrast). The image tokens keep about their "
               "plain score and the question's words gain (they tell the two shapes apart more than they raise the "
               "answer alone); the image tokens still carry most of the difference.",
)
