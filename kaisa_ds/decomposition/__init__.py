"""Factor decompositions (eigen or damped inverse), always computed in FP32 or FP64."""
