"""What a model says about itself (embedded metadata, TFLite Support metadata) and the precedence rule that turns
flags, sidecar and metadata into preprocessing.
"""
