"""Everything rlbox knows of verl, in one room: validating a job against the verl that will run
(verl's own checks first, the restated rules of the seed commits as the offline fallback), the
scripts that run where that verl is, and the verdict types. Imported as ``rlbox.verl...``
(absolute), so it never shadows the real ``verl``."""
