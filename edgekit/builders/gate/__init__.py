"""The accuracy gates: every converted variant checked against the original in its task's units
(top-1, mAP and agreement, landmarks in pixels, mask IoU, cosine), the open-set fit and the speed
measured at build time."""
