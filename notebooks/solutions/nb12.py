"""Exercises of notebook 12 (your own model). 12.1 needs the notebook's average-pooled toy-vit ``avg`` and the
scenes ``x``; 12.2 the tiny CLIP ``clip`` and its ``inputs`` (one image, three prompts)."""
import torch

from lrp_core import Contrast, explain
from lrp_core.methods.products import accumulate

from .exercise import Exercise, Mistake


def context():
    """The notebook's objects (for the tests), built as the notebook builds them."""
    import re

    from timm.models.vision_transformer import VisionTransformer
    from transformers import CLIPConfig, CLIPModel

    from lrp_core.data import make_scenes
    from lrp_core.models import load

    toy = load("toy-vit")
    avg = VisionTransformer(img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4, mlp_ratio=2.0,
                            num_classes=8, global_pool="avg", fc_norm=False).eval()
    avg.load_state_dict(toy.model.state_dict())
    x = make_scenes(4, seed=11, n_objects=2).images

    words = "a photo of dog cat car red blue green tree rather than the".split()
    vocab = {w: i + 2 for i, w in enumerate(words)}
    eos = len(words) + 2

    def tokenize(texts):
        rows = [[1] + [vocab[w] for w in re.findall(r"[a-z]+", t.lower())] + [eos] for t in texts]
        T = max(map(len, rows))
        return {"input_ids": torch.tensor([r + [0] * (T - len(r)) for r in rows]),
                "attention_mask": torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])}

    torch.manual_seed(0)
    cfg = CLIPConfig(text_config=dict(vocab_size=eos + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=16, bos_token_id=1,
                                      eos_token_id=eos, pad_token_id=0),
                     vision_config=dict(image_size=32, patch_size=8, hidden_size=48, intermediate_size=96,
                                        num_hidden_layers=2, num_attention_heads=3), projection_dim=24)
    clip = CLIPModel(cfg).eval()
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(12))
    inputs = dict(tokenize(["a photo of a dog", "a photo of a cat", "a red car"]), pixel_values=image)
    return {"avg": avg, "x": x, "clip": clip, "inputs": inputs}


# ---------------------------------------------------------------- 12.1
def average_readout_row(avg, x):
    exp = explain(avg, x[:1], method="transformer_attribution")
    C = accumulate(exp.layers)                     # (1, 65, 65): I + Ā_b multiplied over the blocks
    score = C[0, 1:, 1:].mean(dim=0)               # w = 1/64 on each patch row, 0 on the [CLS] row
    print("largest difference to exp.scores:", (score - exp.scores[0]).abs().max().item())
    return score


def _cls_row(avg, x):
    return accumulate(explain(avg, x[:1], method="transformer_attribution").layers)[0, 0, 1:]


def _all_rows(avg, x):
    return accumulate(explain(avg, x[:1], method="transformer_attribution").layers)[0, :, 1:].mean(dim=0)


def _columns(avg, x):
    return accumulate(explain(avg, x[:1], method="transformer_attribution").layers)[0, 1:, 1:].mean(dim=1)


ex12_1 = Exercise(
    "ex12_1", "The readout's row", average_readout_row, difficulty=2, minutes=10, needs=("avg", "x"),
    answer="the 64 patch scores of scene 0 for the average-pooled model, computed by hand as wᵀC from "
           "exp.layers",
    hints=["exp = explain(avg, x[:1], method=\"transformer_attribution\"); accumulate(exp.layers) gives C, "
           "shape (1, 65, 65); token 0 is [CLS].",
           "The classifier reads the mean of the 64 patch tokens: w = 1/64 on rows 1…64 and 0 on row 0.",
           "wᵀC is then C[0, 1:, :].mean(dim=0); keep the patch columns 1…64."],
    mistakes=[Mistake(_cls_row, "this is the [CLS] row: right for the token-pooled toy-vit, but this model reads "
                                "the average of the patch tokens, never the [CLS] token"),
              Mistake(_all_rows, "your mean includes the [CLS] row; the average pooling runs over the 64 patch "
                                 "tokens only (w = 0 on [CLS])"),
              Mistake(_columns, "you averaged over the columns (the mean of each row); the readout weights pick "
                                "rows — average over dim 1 of C[0, 1:, 1:] is the wrong axis")],
    discussion="The mean of the patch rows is exactly exp.scores (up to round-off): the engine does the same, "
               "wᵀC with w the readout's token weights. Notice that the [CLS] row plays no part in this model's "
               "map, although the model has a [CLS] token and computes it in every block.",
)


# ---------------------------------------------------------------- 12.2
def dog_rather_than_cat(clip, inputs):
    exp = explain(clip, inputs, method="attnlrp", target=Contrast(positive=0, negative=1))
    print("sum of the contrast map:", round(exp.scores[0].sum().item(), 6))
    return exp.scores[0]


ex12_2 = Exercise(
    "ex12_2", "A dog rather than a cat", dog_rather_than_cat, difficulty=1, minutes=5, needs=("clip", "inputs"),
    answer="the attnlrp map (16 patch scores) of the image as prompt 0 ('a photo of a dog') rather than prompt 1 "
           "('a photo of a cat')",
    hints=["target=lrp_core.Contrast(positive=0, negative=1) explains y_dog − y_cat.",
           "explain(clip, inputs, method=\"attnlrp\", target=...).scores[0] is the image's 16 patch scores."],
    mistakes=[Mistake(lambda clip, inputs: explain(clip, inputs, method="attnlrp", target=0).scores[0],
                      "this is the map of prompt 0 alone; a contrast also subtracts what speaks for prompt 1"),
              Mistake(lambda clip, inputs: explain(clip, inputs, method="generic_attention",
                                                   target=Contrast(positive=0, negative=1)).scores[0],
                      "this is generic_attention's contrast; the exercise asks for method=\"attnlrp\"")],
    discussion="AttnLRP is gradient × input, linear in the explained score, so the contrast map is exactly the "
               "dog map minus the cat map — you could have computed it either way. generic_attention clamps "
               "negative contributions per block, so its contrast is not the difference of its two maps.",
)
