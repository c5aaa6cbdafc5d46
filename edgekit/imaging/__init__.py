"""Frame -> model input: the one preprocessing implementation, and numpy stand-ins for the OpenCV calls it needs.
"""
