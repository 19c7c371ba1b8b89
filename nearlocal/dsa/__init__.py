"""Intel DSA: uapi descriptors (uapi), compiled submission and polling (portal), the
`dsa-memmove` / `dsa-batch` methods (methods); softqueue is a test double, never a method."""
