// Package deploy holds no code: its test checks the container files at the
// repository's root (Dockerfile, docker-compose.yml) against the programs
// they run. No container engine on our machines can pull images, so the
// test checks what can be checked without one:
//
//   - every service's command is a binary the Dockerfile builds, and each
//     of those binaries builds as a static (cgo-free) binary;
//   - every environment variable a service sets is one its program reads,
//     through the same configuration code the program uses, and the values
//     pass that code's checks;
//   - the hosts and ports line up: the published port is the one the
//     server listens on, the processor and database URLs name those
//     services on their ports, the webhooks go to the server's port, and
//     each health check asks its own service's port;
//   - each service's command, with its environment (service names mapped
//     to local addresses), really starts: the migration finishes, the
//     processor and the server listen and answer their health checks, the
//     sweeper sweeps.
package deploy
