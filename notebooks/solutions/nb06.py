"""Solutions for notebook 6 (explaining a ViT)."""
import matplotlib.pyplot as plt

from lrp_core import explain
from lrp_core.metrics import own_mask_share
from lrp_core.viz import show_relevance


def ex6_1(toy, scenes, i=0):
    x = scenes.images[i:i + 1]
    a, b = [int(c) for c in scenes.labels[i]]
    ma, mb = scenes.masks[i:i + 1, 0], scenes.masks[i:i + 1, 1]
    out = {}
    for s in (0, 1, 3):
        sa = own_mask_share(explain(toy.model, x, target=a, start_layer=s).upsample(), ma)[0]
        sb = own_mask_share(explain(toy.model, x, target=b, start_layer=s).upsample(), mb)[0]
        out[s] = (sa, sb)
        print(f"start_layer={s}: share on own object {sa:.2f} / {sb:.2f}")
    return out


def ex6_2(toy, scenes, i=0):
    x = scenes.images[i:i + 1]
    a = int(scenes.labels[i, 0])
    pix = explain(toy.model, x, method="lrp", target=a).pixels[0]
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    axes[0].imshow(scenes.rgb[i]); axes[0].set_axis_off()
    show_relevance(None, pix, ax=axes[1], title="LRP pixels")
    plt.show()
    # It follows edges and texture of the patches (the zB rule at the patch embedding).
    return pix
