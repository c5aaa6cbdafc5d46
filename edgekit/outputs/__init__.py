"""Where results go besides JSON: overlays drawn on frames, recordings of them, stdout that fails loudly.
"""
