"""What every call runs on: the model guard, the precision, wrapped models, the memory budget and its pieces."""
