"""Capture: module hooks that hand layer inputs and output gradients to the factor statistics."""
