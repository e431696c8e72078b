"""What a person writes: corpus files, their blocks (quality, eval), training recipes, and the
validation and reference generated from them."""
