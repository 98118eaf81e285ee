"""Parameter-server mode: sharded servers, a policy coordinator (BSP, ASP, SSP, GSSP) and
group-dynamic top-k (GDTopK) against stragglers. ps/README.md says what lives where."""
