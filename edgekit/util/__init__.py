"""Small utilities every room uses: atomic writes, finite JSON, bounded user JSON, safe file opening, image-size
caps, quiet native output, lazy plug-in loading.
"""
