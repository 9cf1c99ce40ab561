#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    printf("%ld\n", atol(argv[1]) - atol(argv[2]));
    return 0;
}
