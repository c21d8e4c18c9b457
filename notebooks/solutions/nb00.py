"""Solutions for notebook 0 (welcome)."""


def ex0_1(toy):
    m = toy.model
    info = (len(m.blocks), m.blocks[0].attn.num_heads, m.patch_embed.num_patches)
    print("blocks:", info[0], "| heads:", info[1], "| patch tokens:", info[2])
    return info
