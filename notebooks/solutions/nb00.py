"""Exercise of notebook 0 (welcome)."""
from .exercise import Exercise, Mistake


def model_size(toy):
    m = toy.model
    info = (len(m.blocks), m.blocks[0].attn.num_heads, m.patch_embed.num_patches)
    print("blocks:", info[0], "| heads:", info[1], "| patch tokens:", info[2])
    return info


ex0_1 = Exercise(
    "ex0_1", "Inside toy-vit", model_size, difficulty=1, minutes=3, needs=("toy",),
    answer="a tuple (number of blocks, heads per block, patch tokens)",
    hints=["The model is toy.model; len(toy.model.blocks) counts the blocks.",
           "toy.model.blocks[0].attn.num_heads and toy.model.patch_embed.num_patches."],
    mistakes=[Mistake(lambda toy: (len(toy.model.blocks), toy.model.blocks[0].attn.num_heads,
                                   toy.model.patch_embed.num_patches + 1),
                      "the token count includes the [CLS] token; the exercise asks for the patch tokens only"),
              Mistake(lambda toy: (len(toy.model.blocks), toy.model.blocks[0].attn.head_dim,
                                   toy.model.patch_embed.num_patches),
                      "the second number is the width of one head (head_dim); count the heads per block: "
                      "blocks[0].attn.num_heads"),
              Mistake(lambda toy: (len(toy.model.blocks) * toy.model.blocks[0].attn.num_heads,
                                   toy.model.blocks[0].attn.num_heads, toy.model.patch_embed.num_patches),
                      "the first number counts the heads of all blocks; count the blocks: len(toy.model.blocks)"),
              Mistake(lambda toy: (len(toy.model.blocks) + 1, toy.model.blocks[0].attn.num_heads,
                                   toy.model.patch_embed.num_patches),
                      "one block too many: the patch embedding and the classifier head are not blocks — "
                      "len(toy.model.blocks) counts the Transformer blocks (and the last one is "
                      "blocks[len(blocks) - 1], counted from 0)")],
    discussion="An 8 × 8 grid of patches, plus one [CLS] token that the classifier reads: every map of the "
               "course has 64 entries.",
)
