"""What users see and steer of the prefix cache: reports, pins, tenants, export/import."""
