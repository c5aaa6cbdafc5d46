"""Full-integer int8: the recipe, TensorFlow's quantiser, the per-layer quantisation report,
the calibration-stability check and recovery when the gate is missed."""
