"""One night of one corpus as the files every stage trusts: plan, manifest, record format, drop
reasons, held-out selection, the tokenizer's facts."""
